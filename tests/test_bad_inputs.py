"""Bad inputs through the real command line: one line naming the problem, exit 2, nothing written."""
from __future__ import annotations

from pathlib import Path

import pytest

from harness import cli, expectations, registry_cmd

pytestmark = pytest.mark.unit
USAGE = 2


def _run(argv: list[str], capsys) -> tuple[int, str]:
    """Exit status and stderr of ``harness ARGV`` in this process (argparse errors exit via SystemExit)."""
    try:
        code = cli.main(argv)
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize("argv,needle", [
    (["run", "--tier", "models", "--jobs", "0"], "argument --jobs: '0' is not a positive integer"),
    (["run", "--tier", "models", "--jobs", "-3"], "argument --jobs: '-3' is not a positive integer"),
    (["run", "--tier", "models", "--steps", "0"], "argument --steps: '0' is not a positive integer"),
    (["run", "--tier", "models", "--models", "no_such_model"], "unknown model 'no_such_model'"),
    (["run", "--tier", "models", "--models", "mlp_w64:huge"], "mlp_w64 has no config 'huge'"),
    (["run", "--tier", "models", "--backend", "pfvm:tpu"], "--backend: unknown device 'pfvm:tpu'"),
    (["report", "mlp-width", "--widths", "abc"], "argument --widths: 'abc' is not an integer"),
    (["report", "mlp-width", "--widths", "64,0"], "argument --widths: '0' is not a positive integer"),
    (["fuzz", "--seconds", "-5"], "argument --seconds: '-5' is negative"),
    (["fuzz", "--seconds", "nan"], "argument --seconds: 'nan' is not a finite number"),
    (["fuzz", "--case-timeout", "0"], "argument --case-timeout: '0' is not a positive number"),
    (["fuzz", "--shrink-seconds", "soon"], "argument --shrink-seconds: 'soon' is not a number"),
    (["fuzz", "--cases", "-1"], "argument --cases: '-1' is negative"),
    (["fuzz", "--max-numel", "0"], "argument --max-numel: '0' is not a positive integer"),
])
def test_bad_option_is_one_line_and_exit_2(argv, needle, tmp_path, capsys):
    out = tmp_path / "out"
    code, err = _run(argv + ["--out", str(out)], capsys)
    assert code == USAGE and needle in err, err
    assert not out.exists()  # refused before anything was made


@pytest.mark.parametrize("argv", [["run", "--tier", "models"], ["report", "models"], ["fuzz", "--seconds", "0"]])
def test_out_that_is_a_file_is_refused(argv, tmp_path, capsys):
    f = tmp_path / "results"
    f.write_text("keep me")
    code, err = _run(argv + ["--out", str(f)], capsys)
    assert code == USAGE and f"{f} is a file, not a directory" in err, err
    assert f.read_text() == "keep me"


@pytest.mark.parametrize("content,needle", [
    ("", "not a readable CSV"),
    ("model,config\nmlp_w64,tiny\n", "missing column(s) status, graphs_per_step, compiles_after_warmup"),
    ("model,config,status,graphs_per_step,compiles_after_warmup\nmlp_w64,tiny,pas,1,0\n", "status 'pas'"),
    ("model,config,status,graphs_per_step,compiles_after_warmup\nmlp_w64,tiny,pass,one,0\n", "non-integer graphs"),
    ("model,config,status,graphs_per_step,compiles_after_warmup\n\"mlp_w64,tiny,pass,1,0\n", "not a readable CSV"),
])
@pytest.mark.parametrize("update", [False, True], ids=["check", "update"])
def test_corrupt_expectations_are_refused_naming_the_file(content, needle, update, tmp_path, monkeypatch, capsys):
    """Before any model runs: no pandas traceback, no 'improvement' verdicts, the file left as it was."""
    monkeypatch.setattr(expectations, "EXPECTED_DIR", tmp_path / "expected")
    path = expectations.expected_path("models", "pfvm:cpu")
    path.parent.mkdir()
    path.write_text(content)
    out = tmp_path / "r"
    argv = ["run", "--tier", "models", "--models", "mlp_w64:tiny", "--out", str(out)]
    code, err = _run(argv + (["--update-expected"] if update else []), capsys)
    assert code == USAGE and str(path) in err and needle in err and "--update-expected" in err, err
    assert len(err.strip().splitlines()) == 1
    assert path.read_text() == content and not out.exists()


def test_empty_registry_in_zoo_list(tmp_path, monkeypatch, capsys):
    empty = tmp_path / "registry.jsonl"
    empty.write_text("")
    monkeypatch.setattr(registry_cmd, "DEFAULT_PATH", empty)
    code, err = _run(["zoo", "list"], capsys)
    assert code == USAGE and f"shape registry {empty} is empty" in err and "harness registry record" in err, err


def test_report_from_a_missing_directory(tmp_path, capsys):
    missing = tmp_path / "typo"
    code, err = _run(["report", "all", "--from", str(missing)], capsys)
    assert code == USAGE and f"--from {missing}: no such directory" in err, err
    assert not missing.exists()


def test_report_from_a_directory_without_results(tmp_path, capsys):
    code, err = _run(["report", "all", "--from", str(tmp_path)], capsys)
    assert code == USAGE and "no results of mlp-width, async, models" in err, err
    assert not (tmp_path / "index.md").exists()


def test_fuzz_out_holding_an_earlier_campaign(tmp_path: Path, capsys):
    (tmp_path / "results.jsonl").write_text('{"index": 0}\n')
    code, err = _run(["fuzz", "--seconds", "0", "--out", str(tmp_path)], capsys)
    assert code == USAGE and f"--resume {tmp_path}" in err, err
    assert (tmp_path / "results.jsonl").read_text() == '{"index": 0}\n'
