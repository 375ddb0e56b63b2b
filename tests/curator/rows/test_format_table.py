"""The format table: every format one module and one registration, auto-detection in rank order."""

from __future__ import annotations

import pytest

from curator.rows.formats.conversation import Conversation
from curator.rows.formats.table import FORMATS, RowFormat, aliases, detect_format, register


def test_a_column_set_is_tried_before_the_sets_it_contains() -> None:
    assert detect_format({"system", "conversations"}) == "openthoughts"
    assert detect_format({"conversations"}) == "sharegpt"
    assert detect_format({"instruction", "input", "output"}) == "alpaca"
    assert detect_format({"input", "output"}) == "input-output"
    assert detect_format({"text", "label"}) is None


def test_the_tap_format_is_in_the_table_and_keeps_its_answers_only_when_asked() -> None:
    tap = FORMATS["tap"]
    record = {"kind": "curator.tap", "version": 1, "endpoint": "chat", "status": 200, "complete": True,
              "messages": [{"role": "user", "content": "hi"}], "answer": {"content": "hello"}}
    assert tap.turns == "last" and not tap.columns
    assert [r for r, _ in tap.normaliser(keep_responses=True)(record)] == ["user", "assistant"]
    assert [r for r, _ in tap.normaliser(keep_responses=False)(record)] == ["user"]


def test_a_name_or_alias_taken_twice_is_refused() -> None:
    def one_turn(row: object) -> Conversation:
        return Conversation([("user", "x")])

    for name in ("sharegpt", "apigen"):
        with pytest.raises(ValueError, match="registered twice"):
            register(RowFormat(name, one_turn))
    assert aliases()["apigen"] == "xlam"
