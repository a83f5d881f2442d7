# Newcomer entry points: `make run` and `make test` (both create .venv when missing).
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test install clean bench registry report catalog

$(BIN)/python:
	$(PY) -m venv $(VENV) || python3 -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,ray]'
	touch $(STAMP)

install: $(STAMP)

# The models tier (~5 min on 2 cores): one line per model and mode at the end; results/<timestamp>/ holds
# results.jsonl, results.csv, summary.md and index.html (the same summary as a page).
run: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/harness run --tier models

test: $(STAMP)
	HF_HUB_OFFLINE=1 MNCORE_OPTEST_SAMPLE=$${MNCORE_OPTEST_SAMPLE:-1500} $(BIN)/python -m pytest -n auto -q

bench: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/trace_overhead.py

# Performance reports on pfvm:cpu (+ mncore2:auto performance mode when it exists): reports/out/ (everything,
# incl. Chrome traces) and the commit-ready copy reports/published/ (Markdown, PNGs, CSVs).
report: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/harness report all --publish reports/published

# docs/figures.md: every figure the README and docs/ quote, rendered from the committed results files
# (reports/published/, docs/conformance-results/); run it after `make report`.
.PHONY: figures
figures: $(STAMP)
	$(BIN)/python -m reports.figures

registry: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/harness registry record --configs tiny,default --jobs 2

# The model catalog (model_zoo/catalog/catalog.jsonl), then its models in the shape registry (tiny configs).
catalog: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/harness zoo collect --jobs 2
	HF_HUB_OFFLINE=1 $(BIN)/harness registry record --catalog --jobs 2

clean:
	rm -rf $(VENV) .pytest_cache
