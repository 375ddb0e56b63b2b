"""YAML configs the user did not write: every way a file can fail to load is the named YAML error."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from curator.cli import main
from training.io.safe_yaml import error_text, safe_load

BIG = "7" * 5000  # over Python's 4300-digit limit for int(str)


def test_an_integer_too_long_to_read_is_a_yaml_error_naming_the_line() -> None:
    with pytest.raises(yaml.YAMLError) as caught:
        safe_load(f"name: big\nseed: {BIG}\n")
    said = error_text(caught.value)
    assert said.startswith("line 2 not valid YAML: an integer of 5000 characters") and len(said) < 200
    assert safe_load("a: 12\nb: 0x1f\nc: 1_000\nd: -3\n") == {"a": 12, "b": 31, "c": 1000, "d": -3}


def _one_named_line(err: str, path: Path) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "unexpected" not in err and "Traceback" not in err, err
    assert f"{path}: line " in lines[0] and "not valid YAML: an integer of 5000 characters" in lines[0], err
    assert lines[0].count(str(path)) == 1, err  # the path is said once, not by the reader and again by the command


def test_a_recipe_with_a_5000_digit_integer_exits_1_with_one_named_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"name: big\nsources:\n  - path: a.jsonl\n    samples: {BIG}\n")
    code = main(["build-mix", "--recipe", str(recipe), "--out", str(tmp_path / "mix"), "--offline",
                 "--catalog", str(tmp_path / "c.duckdb")])
    assert code == 1
    _one_named_line(capsys.readouterr().err, recipe)


def test_a_train_config_with_a_5000_digit_integer_exits_1_with_one_named_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "train.yaml"
    config.write_text(f"data: d\ntarget: t\nout: o\nseed: {BIG}\n")
    assert main(["train", "--config", str(config)]) == 1
    _one_named_line(capsys.readouterr().err, config)


@pytest.mark.parametrize("content, says", [(b"\xff\xfe\x00binary", "is not text"), (b"data: d\ntarget: t\nout: o\nlr: [x]\n", "'lr' must be float")])
def test_a_train_config_error_names_the_file_once(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, says: str) -> None:
    config = tmp_path / "bin.yaml"
    config.write_bytes(content)
    assert main(["train", "--config", str(config)]) == 1
    err = capsys.readouterr().err.strip()
    assert says in err and err.count(str(config)) == 1, err
