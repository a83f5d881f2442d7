"""``harness run``'s closing summary: one line per model with each mode's status, the reason of a
non-pass in a few words, the verdict against the expectations file and the step time against the
baseline; summary.md and index.html hold the same table (rendered by the report pages' renderer)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness import cli, expectations, tiers
from reports import run_summary
from reports.schema import CapturedResult, ModelRow, ModeResult
from tests.helpers import fake_run_models

pytestmark = pytest.mark.unit

MOE_REASON = ("NotCompilableError: mncore: _grouped_mm at transformers/integrations/moe.py:379 in _grouped_mm: its "
              "output shape is not known before it runs (Expected mat_a to be BFloat16); a Context function compiles "
              "to one graph with static shapes, so it cannot hold this op: run the step in lazy mode")


def _row(model: str, lazy_ms: float, context: tuple[str, str] = ("pass", "")) -> ModelRow:
    status, reason = context
    return ModelRow(model=model, config="tiny", backend="pfvm:cpu", steps=3, time_kind="measured wall time",
                    status="pass" if status == "pass" else status, reason="" if status == "pass" else f"context: {reason}",
                    repro="", graphs_per_step=1, compiles_after_warmup=0, eager_losses=[1.0, 0.9, 0.8],
                    eager_step_ms=5.0, lazy=ModeResult(step_ms=lazy_ms, status="pass"),
                    context=ModeResult(step_ms=2.0 if status == "pass" else None, status=status, reason=reason or None),
                    lazy_captured=CapturedResult(step_ms=3.0, status="pass", replays_per_step=1.0))


def test_summary_line_per_model_with_modes_reasons_verdicts_and_the_page(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(expectations, "EXPECTED_DIR", tmp_path / "expected")
    ran = [_row("mlp_w64", 12.0), _row("mixtral_moe", 80.0, ("not_compilable", MOE_REASON)),
           _row("llama", 50.0, ("fail_to_run", "RuntimeError: boom in the step")), _row("gru_lm", 30.0)]
    # the checked-in state: mlp_w64 (lazy baseline 10 ms) and mixtral_moe as they ran, llama passing, no gru_lm
    recorded = [ran[0].to_json() | {"lazy_step_ms": 10.0}, ran[1].to_json(), _row("llama", 50.0).to_json()]
    expectations.update(recorded, "models", "pfvm:cpu")
    monkeypatch.setattr(tiers, "run_models", fake_run_models(ran))
    out = tmp_path / "r"
    code = cli.main(["run", "--tier", "models", "--models", "mlp_w64:tiny,mixtral_moe:tiny,llama:tiny,gru_lm:tiny",
                     "--out", str(out)])
    assert code == 1  # llama's Context API regressed
    text = capsys.readouterr()
    lines = {line.split()[0]: line for line in text.out.splitlines() if re.match(r"^\w+:tiny ", line)}
    assert set(lines) == {"mlp_w64:tiny", "mixtral_moe:tiny", "llama:tiny", "gru_lm:tiny"}
    cols = lambda m: lines[m].split()[1:6]  # noqa: E731 - eager, lazy, captured, Context, expectations
    assert cols("mlp_w64:tiny") == ["pass", "pass", "pass", "pass", "expected"]
    assert "lazy +20% (slower)" in lines["mlp_w64:tiny"]  # 12 ms against the 10 ms baseline
    assert cols("mixtral_moe:tiny") == ["pass", "pass", "pass", "not_compilable", "expected"]
    assert lines["mixtral_moe:tiny"].endswith("Context: NotCompilableError: _grouped_mm: its output shape is not "
                                              "known before it runs")
    assert cols("llama:tiny") == ["pass", "pass", "pass", "fail_to_run", "changed"]
    assert lines["llama:tiny"].endswith("Context: RuntimeError: boom in the step")
    assert cols("gru_lm:tiny") == ["pass", "pass", "pass", "pass", "new"]
    assert "4 model configs: 2 pass in every mode, 2 do not (mixtral_moe:tiny, llama:tiny)" in text.out
    assert "1 expected" not in text.out and "2 expected, 1 new, 1 changed" in text.out
    assert not any(line.startswith("perf:") for line in text.out.splitlines())
    assert re.search(r"1-minute load average [\d.]+ at the start, [\d.]+ at the end on \d+ cores", text.out)
    last = text.out.strip().splitlines()[-1]
    assert last == f"results: {out / 'results.jsonl'} and {out / 'results.csv'}; summary: {out / 'summary.md'}; " \
                   f"page: {out / 'index.html'}"
    assert "llama:tiny: status 'pass' -> 'fail_to_run' (regression)" in text.err
    html = (out / "index.html").read_text()
    assert "<td>not_compilable</td>" in html and "<td>changed</td>" in html and "`" not in html
    md = (out / "summary.md").read_text()
    assert "| mixtral_moe:tiny | pass | pass | pass | not_compilable | expected |" in md
    assert "models_pfvm_cpu.csv: llama:tiny: status 'pass' -> 'fail_to_run' (regression)" in md


def test_a_mode_after_a_failed_one_keeps_its_own_status():
    """Lazy fails and the Context API fails too: each mode says so (the row keeps the first failure)."""
    r = _row("m", 1.0).to_json() | {"status": "fail_accuracy", "reason": "lazy vs eager: max abs err 0.4",
                                     "lazy_status": "fail_accuracy", "lazy_reason": "max abs err 0.4",
                                     "context_status": "oom", "context_reason": "RuntimeError: out of memory"}
    assert run_summary.mode_statuses(r) == {"eager": "pass", "lazy": "fail_accuracy", "captured": "pass",
                                            "Context": "oom"}
    assert run_summary.why(r) == "lazy: max abs err 0.4; Context: RuntimeError: out of memory"
    crashed = {"model": "m", "config": "tiny", "backend": "pfvm:cpu", "status": "timeout",
               "reason": "no result within 900 s (killed)"}
    assert run_summary.mode_statuses(crashed) == {"eager": "–", "lazy": "–", "captured": "–", "Context": "–"}
    assert run_summary.why(crashed) == "timeout: no result within 900 s"


def test_runner_records_each_mode_status(monkeypatch):
    """A real row whose Context API raises: lazy and captured pass on their own, Context says fail_to_run."""
    from harness import runner

    def broken(*a, **k):
        raise RuntimeError("context broke")

    monkeypatch.setattr(runner, "run_context", broken)
    row = runner.run_one("mlp_w64", "tiny", "pfvm:cpu", steps=2).to_json()
    assert run_summary.mode_statuses(row) == {"eager": "pass", "lazy": "pass", "captured": "pass",
                                              "Context": "fail_to_run"}
    assert row["status"] == "fail_to_run" and run_summary.why(row) == "Context: RuntimeError: context broke"
