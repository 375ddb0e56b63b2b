"""What a newcomer met in issue 33 (item 4): long work shows a bar, refusals leave nothing behind and
come before anything slow, and the advice given is advice that works."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import pytest
import yaml

from curator import forecast as fc
from curator.cli import main


def _recipe(folder: Path, body: dict) -> Path:
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump({"name": "ux", "seed": 0, **body}))
    return path


# ------------------------------------------------------------------ forecast


def test_forecast_draws_a_bar_for_each_subsets_training(
    tiny_target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.training.train.test_trainer import make_store

    store = make_store(tiny_target, tmp_path / "store", n=40)
    cfg = tmp_path / "train.json"
    cfg.write_text(json.dumps({"draft_vocab_size": 512, "ttt_steps": 3, "global_batch_size": 2, "micro_batch_size": 2,
                               "max_steps": 2, "log_every": 1, "device": "cpu"}))
    assert main(["forecast", "--store", str(store), "--target", str(tiny_target), "--fractions", "0.25,0.5,1",
                 "--config", str(cfg), "--out", str(tmp_path / "runs"), "--goal", "3.0"]) == 0
    captured = capsys.readouterr()
    for frac in ("0.25", "0.5", "1"):
        bar = [line for line in captured.err.splitlines() if line.startswith(f"fraction {frac} ") and "2/2" in line]
        assert bar, captured.err  # the subset's own bar, at its last step
    # --target was given: the advice asks only for what is missing
    assert "cost: give --generation GEN_DIR to price the samples" in captured.out
    assert "and --target" not in captured.out


def test_a_band_with_unbounded_draws_raises_no_numpy_warning() -> None:
    # noisy points close to K+1 = 5: many drawn lines never reach 4.5, and the 90th percentile lies
    # between two of them
    points = [fc.Point(n, a, se=0.1) for n, a in ((100, 3.0), (200, 3.2), (400, 3.41))]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = fc.forecast_category("code", points, goal=4.5, steps=4)
    assert out.verdict == "forecast" and out.band is not None
    lo, hi = out.band
    assert math.isfinite(lo) and hi == math.inf


def test_the_cost_advice_names_target_only_when_it_was_not_given(capsys: pytest.CaptureFixture[str]) -> None:
    from curator.commands.forecast import render

    points = {"code": [fc.Point(n, 1.2 + 0.15 * math.log(n)) for n in (250, 500, 1000)]}
    render(fc.make_forecast(points, 2.5, 7))
    assert "cost: give --generation GEN_DIR (and --target for the disk) to price the samples" in capsys.readouterr().out
    render(fc.make_forecast(points, 2.5, 7, bytes_per_token=2 * 3 * 64))
    assert "cost: give --generation GEN_DIR to price the samples\n" in capsys.readouterr().out


# ------------------------------------------------------------------ refusals leave nothing behind


def test_a_train_refused_for_a_missing_store_leaves_no_run_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "runs" / "draft-1"
    assert main(["train", f"data={tmp_path / 'no-states'}", f"target={tmp_path / 'no-model'}", f"out={out}"]) == 1
    assert "not a hidden-state store" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # neither the run folder nor the parent it made


def test_a_failed_train_into_an_existing_folder_keeps_the_folder_and_what_is_in_it(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(["train", f"data={tmp_path / 'no-states'}", f"target={tmp_path / 'no-model'}", f"out={out}"]) == 1
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_a_train_refused_for_its_eval_store_or_batch_size_writes_no_run_folder(
    tiny_target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.training.train.test_trainer import make_store

    store = make_store(tiny_target, tmp_path / "store", n=8)
    common = [f"data={store}", f"target={tiny_target}", "device=cpu", "draft_vocab_size=128"]
    out = tmp_path / "run-a"
    assert main(["train", *common, f"eval_data={tmp_path / 'no-eval-states'}", f"out={out}"]) == 1
    assert "no-eval-states" in capsys.readouterr().err and not out.exists()
    out = tmp_path / "run-b"
    assert main(["train", *common, "global_batch_size=64", "micro_batch_size=8", f"out={out}"]) == 1
    assert "fewer than global_batch_size" in capsys.readouterr().err and not out.exists()


# ------------------------------------------------------------------ advice that works


def test_generate_on_a_folder_that_is_not_a_mix_does_not_suggest_building_into_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sources = tmp_path / "sources"
    sources.mkdir()
    (sources / "chat.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    assert main(["generate", "--mix", str(sources), "--out", str(tmp_path / "gen"), "--model", "m",
                 "--endpoint", "http://127.0.0.1:9", "--catalog", str(tmp_path / "c.duckdb")]) == 1
    err = capsys.readouterr().err
    assert f"{sources} is not a mix" in err and "chat.jsonl" in err
    assert f"--out {sources}" not in err  # build-mix refuses that folder as --out
    assert "--out MIX" in err and "--mix MIX" in err
    # the advice works: build-mix takes a new folder as --out
    recipe = _recipe(tmp_path, {"sources": [{"path": "sources/chat.jsonl", "name": "chat", "samples": 1,
                                             "category": "chat", "format": "messages"}]})
    assert main(["build-mix", "--recipe", str(recipe), "--out", str(tmp_path / "mix"),
                 "--catalog", str(tmp_path / "c.duckdb")]) == 0


def test_an_interrupted_build_is_still_told_to_rebuild_into_the_same_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mix = tmp_path / "mix"
    mix.mkdir()
    assert main(["generate", "--mix", str(mix), "--out", str(tmp_path / "gen"), "--model", "m",
                 "--endpoint", "http://127.0.0.1:9", "--catalog", str(tmp_path / "c.duckdb")]) == 1
    assert f"--out {mix}" in capsys.readouterr().err


def test_build_mix_offline_names_every_dataset_missing_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # restored after the test: --offline sets it for the process
    (tmp_path / "datasets" / "org___cached" / "default" / "0.0.0" / "abc123").mkdir(parents=True)
    recipe = _recipe(tmp_path, {
        "sources": [{"dataset": d, "samples": 5, "category": "chat"} for d in ("org/first", "org/cached", "org/second")],
        "decontaminate": [{"dataset": "openai/gsm8k", "field": "question"}],
    })
    assert main(["build-mix", "--recipe", str(recipe), "--out", str(tmp_path / "mix"),
                 "--catalog", str(tmp_path / "c.duckdb"), "--offline"]) == 1
    err = capsys.readouterr().err
    assert all(d in err for d in ("org/first", "org/second", "openai/gsm8k")) and "org/cached" not in err
    assert "3 source(s)" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "mix").exists()


# ------------------------------------------------------------------ cheap inputs first


@pytest.fixture
def load_target_calls(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The target loads `curator eval` started (the real loader, counted)."""
    import training.eval.evaluate as evaluate

    calls: list[Path] = []
    real = evaluate.load_target

    def counted(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(Path(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(evaluate, "load_target", counted)
    return calls


def test_eval_names_a_missing_or_broken_draft_before_loading_the_target(
    tiny_target: Path, tmp_path: Path, load_target_calls: list[Path], capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("how do I sort a list?\n")
    missing = tmp_path / "no-draft"
    assert main(["eval", "--model", str(tiny_target), "--draft", str(missing), "--prompts", str(prompts)]) == 1
    assert f"--draft {missing}: no such file or folder" in capsys.readouterr().err
    broken = tmp_path / "broken-draft"
    broken.mkdir()
    assert main(["eval", "--model", str(tiny_target), "--draft", str(broken), "--prompts", str(prompts)]) == 1
    assert "not an exported draft" in capsys.readouterr().err
    assert load_target_calls == []
    assert main(["eval", "--model", str(tmp_path / "no-model"), "--draft", str(missing), "--prompts", str(prompts)]) == 1
    assert f"--model {tmp_path / 'no-model'}: no such file or folder" in capsys.readouterr().err


def test_profile_of_an_empty_file_errors_before_drawing_a_bar(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "traffic.jsonl"
    empty.write_text("")
    assert main(["profile", "--traffic", str(empty), "--out", str(tmp_path / "p.json")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error:") and "profiling" not in err and "0/?" not in err
