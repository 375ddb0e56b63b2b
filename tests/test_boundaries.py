"""The architecture, checked (docs/architecture.md): training/ imports nothing of curator/ (it runs on
GPU machines with only torch, transformers, safetensors and numpy); every package sits on a floor
and imports only from floors below it or from itself; no import circle anywhere; no private name
imported from another module; and the one record that crosses from curator/ to training/ (the
generation record) says which version it is."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.imports_graph import Edge, circles, edges, modules
from training.records.gen_record import RECORD_FORMAT, record_problem

ROOT = Path(__file__).resolve().parents[1]

# Lowest first. A unit is a package directly under curator/ or training/ (or a top-level module);
# it may import its own modules and any unit on a lower floor, never one on its floor or above.
FLOORS: list[tuple[str, ...]] = [
    ("training", "training.errors"),
    ("training.io", "training.runtime"),
    ("training.target", "training.records"),
    ("training.storage",),
    ("training.capture",),
    ("training.feed",),
    ("training.eval",),  # speculative decoding and acceptance, any draft kind's (the Proposer protocol)
    ("training.eagle3",),
    ("training.drafts",),  # the draft-kind registry: over the kinds it registers, under all that asks it
    ("training.train",),
    ("training.export",),
    ("training.trainer", "training.hidden_states"),  # the entry modules of `python -m`
    ("curator", "curator.errors", "curator.aio", "curator.cpu", "curator.http", "curator.ui", "curator.loss_report",
     "curator.signals"),
    ("curator.wheels",),  # pinned files from the package registry: below the packages that read them
    ("curator.rows", "curator.llm", "curator.hub", "curator.catalog", "curator.engines", "curator.targets",
     "curator.handoff"),
    ("curator.sql", "curator.traffic", "curator.generate", "curator.doctor", "curator.hidden", "curator.train_progress"),
    ("curator.mix", "curator.forecast", "curator.tap"),
    ("curator.scout", "curator.serve_bench"),
    ("curator.evaluation", "curator.stages"),
    ("curator.demo",),
    ("curator.commands",),
    ("curator.cli",),
    ("curator.__main__",),
]
FLOOR = {unit: level for level, units in enumerate(FLOORS) for unit in units}


def unit_of(module: str) -> str:
    """Return the unit a module belongs to: its first two name parts (curator.mix.build -> curator.mix)."""
    return ".".join(module.split(".")[:2])


def floor_violations(found: list[Edge]) -> list[str]:
    bad = []
    for e in found:
        a, b = unit_of(e.importer), unit_of(e.imported)
        if a != b and FLOOR[b] >= FLOOR[a]:
            bad.append(f"{e.where}: {a} (floor {FLOOR[a]}) imports {b} (floor {FLOOR[b]})")
    return bad


def test_every_package_sits_on_a_floor() -> None:
    units = {unit_of(m) for m in modules()}
    assert units - set(FLOOR) == set(), "place each new package on a floor in FLOORS and docs/architecture.md"
    assert set(FLOOR) - units == set(), "a floor names a package that is gone"


def test_no_import_runs_up_a_floor_or_across_one() -> None:
    assert floor_violations(edges()) == []


def test_no_import_circle() -> None:
    graph: dict[str, set[str]] = {}
    for e in edges():
        graph.setdefault(e.importer, set()).add(e.imported)
    assert circles(graph) == []


def test_no_private_name_is_imported_from_another_module() -> None:
    private = [f"{e.where}: {e.importer} takes {n} from {e.imported}" for e in edges()
               for n in e.names if n.startswith("_") and not n.startswith("__")]
    assert private == []


def test_the_floor_rule_notices_an_import_up_a_floor_and_a_circle() -> None:
    up = Edge("curator.rows.schema", "curator.mix.build", "x.py:1", ("build_mix",))
    side = Edge("curator.mix.build", "curator.forecast", "y.py:2", ())
    down = Edge("curator.mix.build", "curator.rows.schema", "z.py:3", ())
    rows, mix = FLOOR["curator.rows"], FLOOR["curator.mix"]
    assert FLOOR["curator.forecast"] == mix > rows
    assert floor_violations([up, side, down]) == [
        f"x.py:1: curator.rows (floor {rows}) imports curator.mix (floor {mix})",
        f"y.py:2: curator.mix (floor {mix}) imports curator.forecast (floor {mix})"]
    assert circles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]


def test_the_architecture_page_shows_the_floors_the_test_holds() -> None:
    page = (ROOT / "docs" / "architecture.md").read_text()
    rows = re.findall(r"^\| (\d+) \| ([^|]+) \|", page, flags=re.M)
    shown = {int(level): tuple(u.strip().strip("`") for u in units.split(",")) for level, units in rows}
    assert shown == dict(enumerate(FLOORS))


def test_training_never_imports_curator() -> None:
    offenders = []
    for path in sorted((ROOT / "training").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            offenders += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names if n.split(".")[0] == "curator"]
    assert not offenders, offenders


def test_generation_records_carry_their_version_and_another_version_is_refused() -> None:
    from curator.generate.conversation import Regenerated, output_record
    from curator.rows.schema import MixRow

    row = MixRow(id="r1", source="s", category="chat", messages=[{"role": "user", "content": "hi"}])
    answered = Regenerated(messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok", "train": True}],
                           mode="text")
    record = output_record(row, answered, "m")
    assert record["format"] == RECORD_FORMAT == "curator-generation/1"
    assert record_problem(record) is None
    assert record_problem({k: v for k, v in record.items() if k != "format"}) is None  # earlier records: version 1
    problem = record_problem({**record, "format": "curator-generation/2"})
    assert problem is not None and "curator-generation/2" in problem
