"""Every way a JSON file can fail is a named refusal (issue 49 item 8)."""

from __future__ import annotations

from pathlib import Path

import pytest

from training.io.jsonfile import JSONFileError, parse_json, read_json


@pytest.mark.parametrize(("text", "reason"), [
    ('{"n": ' + "7" * 5000 + "}", "5000 digits"),
    ("{\"a\": " * 100_000 + "1" + "}" * 100_000, "nested deeper"),
    ('{"a": 1', "Expecting"),
    (b'{"a": "\xff"}', "utf-8"),
])
def test_a_file_python_cannot_parse_is_a_json_file_error(tmp_path: Path, text: str | bytes, reason: str) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(JSONFileError, match=f"{path} is not valid JSON .*{reason}"):
        read_json(path)
    with pytest.raises(ValueError):
        parse_json(path.read_bytes())


def test_a_missing_file_passes_as_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_json(tmp_path / "absent.json")


def test_an_eval_prompt_line_nested_100k_deep_is_a_malformed_row(tmp_path: Path) -> None:
    from training.eval.prompts import load_prompt_file

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n' + "[" * 100_000 + "]" * 100_000 + "\n")
    loaded, malformed = load_prompt_file(prompts)
    assert (len(loaded), malformed) == (1, 1)
