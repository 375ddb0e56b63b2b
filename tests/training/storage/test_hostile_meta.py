"""A store's JSON files that Python's parser cannot take are a named store error, never an unexpected one."""

from __future__ import annotations

from pathlib import Path

import pytest

from training.storage.index import StoreError, read_json


@pytest.mark.parametrize("text", ["[" * 100_000, "1" * 5_000, "{\"a\": 1", "\xff\xfe"])
def test_hostile_meta_json_is_a_store_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "meta.json"
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(StoreError, match="is not valid JSON"):
        read_json(path)
