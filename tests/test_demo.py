"""`curator demo` end to end (smaller settings): every stage leaves its artefacts in the workdir."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from curator.catalog import Catalog
from curator.cli import main
from curator.demo.pipeline import QUICK, STATE_FILE, Demo
from curator.mix.schema import MANIFEST
from training.store import HiddenStateStore


@pytest.mark.slow
def test_demo_runs_every_stage_and_leaves_its_artefacts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    work = tmp_path / "demo"
    assert main(["demo", "--workdir", str(work), "--quick"]) == 0
    err = capsys.readouterr().err

    catalog = Catalog.open(work / "catalog.duckdb")
    assert catalog.query("SELECT count(*) FROM candidates")[1][0][0] >= 10
    assert len(catalog.approved_candidates()) >= 3
    assert catalog.query("SELECT count(*) FROM mixes")[1][0][0] == 1
    assert catalog.query("SELECT count(*) FROM generation_runs")[1][0][0] == 1
    assert catalog.query("SELECT count(*) FROM training_runs")[1][0][0] == 1
    assert (work / "proposed-recipe.yaml").is_file()

    manifest = json.loads((work / "mix" / MANIFEST).read_text())
    assert manifest["total"]["kept"] > 50
    assert {s["category"] for s in manifest["sources"]} >= {"agentic", "chat", "code"}

    rows = [json.loads(line) for shard in sorted((work / "gen").glob("shard-*.jsonl")) for line in shard.read_text().splitlines()]
    assert len(rows) == manifest["total"]["kept"]
    assert len({r["id"] for r in rows}) == len(rows)

    store = HiddenStateStore.open(work / "states")
    # Every record is stored; a generation whose context the template re-renders differently (an
    # answer cut off at max_tokens gets its end token back in history) is a sample of its own.
    assert {r["id"] for r in rows} <= set(store.ids()) and len(store) >= len(rows) and store.meta.has_final

    assert (work / "run" / "metrics.jsonl").is_file()
    config = json.loads((work / "export" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]

    report = json.loads((work / "eval.json").read_text())
    assert report["prompts_decoded"] > 0 and report["acceptance_length"] >= 1.0
    html = (work / "report.html").read_text()
    assert html.count("<img") == 3 and "acceptance" in html.lower()

    # The stages printed the commands that reproduce them, the doctor refused EAGLE.
    assert "$ curator build-mix --recipe" in err and "$ curator eval --model" in err
    summary = json.loads((work / "report.json").read_text())
    names = [s["name"] for s in summary["stages"]]
    assert names == ["scout", "review", "build-mix", "target", "generate", "plan", "hidden-states", "train",
                     "export", "doctor", "doctor (EAGLE)", "eval"]
    target = next(s for s in summary["stages"] if s["name"] == "target")
    assert target["figures"]["train steps"] == f"{QUICK.target_steps} of {QUICK.target_steps}"
    assert "target train steps" in err and "how to read it" in err
    # the tool-calling prompts' answers are tool calls the target wrote in its own special tokens
    generated = next(s for s in summary["stages"] if s["name"] == "generate")["figures"]["tool calls written"]
    calls, total = (int(x) for x in generated.split(" of "))
    with_tools = [m for r in rows if r.get("tools") for m in r["messages"] if m.get("train")]
    assert total == len(with_tools) > 0 and calls == sum(bool(m.get("tool_calls")) for m in with_tools)
    assert "tool calls the target wrote" in err

    # A second run in the same folder takes up the first: nothing is done twice, nothing recorded twice.
    counts = "SELECT (SELECT count(*) FROM candidates), (SELECT count(*) FROM mixes), " \
             "(SELECT count(*) FROM generation_runs), (SELECT count(*) FROM training_runs)"
    before = catalog.query(counts)[1]
    assert main(["demo", "--workdir", str(work), "--quick"]) == 0
    assert "done by an earlier run" in capsys.readouterr().err
    assert catalog.query(counts)[1] == before
    assert json.loads((work / "report.json").read_text())["acceptance_length"] == report["acceptance_length"]

    # --fresh removes what the demo made (and only that) before it starts over.
    (work / "notes.txt").write_text("mine")
    Demo(work, QUICK, fresh=True)._load_state()
    assert sorted(p.name for p in work.iterdir()) == ["notes.txt"] and not (work / STATE_FILE).exists()
