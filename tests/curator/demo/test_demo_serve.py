"""`curator demo --serve`: without a vLLM it says what it needs before any stage runs; the serving
itself runs against the real engine in tests/serving/test_served_demo.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from curator.cli import main
from curator.demo.report import DemoReport, StageResult, summary_rows


def test_serve_without_a_vllm_names_what_it_needs_and_runs_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is importable in this environment")
    monkeypatch.delenv("CURATOR_VLLM_PYTHON", raising=False)
    work = tmp_path / "demo"
    assert main(["demo", "--quick", "--serve", "--workdir", str(work)]) == 1
    err = capsys.readouterr().err
    assert "--serve needs vLLM" in err and "CURATOR_VLLM_PYTHON" in err
    assert not work.exists()  # refused before the first stage


def test_serve_with_a_python_that_is_not_there_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("CURATOR_VLLM_PYTHON", str(tmp_path / "no-such-python"))
    assert main(["demo", "--quick", "--serve", "--workdir", str(tmp_path / "demo")]) == 1
    assert "is not a file" in capsys.readouterr().err


def test_the_summary_puts_the_engines_acceptance_beside_curator_evals() -> None:
    report = DemoReport(workdir=Path("."), acceptance_length=1.68, eval_steps=3)
    report.stages.append(StageResult("serve (vLLM)", 1.0, {"engine": "vLLM 0.32.0, method eagle3, 3 tokens per step",
                                                           "acceptance length, vLLM (K=3)": 1.6796}, "cmd"))
    rows = dict(summary_rows(report))
    assert rows["acceptance length, served by vLLM 0.32.0, method eagle3, 3 tokens per step"] == \
        "1.68 (curator eval: 1.68)"
