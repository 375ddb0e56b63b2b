"""Tool schemas are kept as the source wrote them (issue 47 item 3): BFCL's `{"type": "dict", "properties",
"required"}` is a JSON schema with a Python type name, not an xlam map of arguments."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from curator.rows.formats.conversation import MalformedRow
from curator.rows.formats.tools import tool_schema

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "prompts"
BFCL = "bfcl_eval/data/BFCL_v4_simple_python.json"
BFCL_LIVE = "bfcl_eval/data/BFCL_v4_live_simple.json"


def test_a_bfcl_dict_schema_is_kept_as_written_with_dict_read_as_object():
    # Before the fix, any parameters whose type was not "object" were taken for an xlam map: BFCL's
    # {"type": "dict", "properties", "required"} became three bogus parameters named type/properties/required.
    row = json.loads((FIXTURES / BFCL).read_text().splitlines()[0])
    params = tool_schema(row["function"][0])["function"]["parameters"]
    assert params == {"type": "object", "required": ["base", "height"],
                      "properties": row["function"][0]["parameters"]["properties"]}


def test_a_nested_dict_is_read_as_object_and_nothing_else_changes():
    row = json.loads((FIXTURES / BFCL_LIVE).read_text())
    written = row["function"][0]["parameters"]
    params = tool_schema(row["function"][0])["function"]["parameters"]
    assert params["type"] == "object" and params["required"] == ["url"]
    assert params["properties"]["params"] == {**written["properties"]["params"], "type": "object"}
    assert params["properties"]["url"] == written["properties"]["url"]


def test_an_xlam_map_still_becomes_properties_and_an_argument_named_type_stays_an_argument():
    xlam = {"name": "f", "parameters": {"type": {"type": "str", "description": "kind"}, "n": {"type": "int"}}}
    assert tool_schema(xlam)["function"]["parameters"] == {"type": "object", "properties": xlam["parameters"]}
    with pytest.raises(MalformedRow, match="neither a JSON schema nor a map"):
        tool_schema({"name": "f", "parameters": {"a": 1}})
