"""The contracts between the toolkit's two halves: training/ imports nothing of curator/ (it runs on
GPU machines with only torch, transformers, safetensors and numpy), and the one record that crosses
from curator/ to training/ (the generation record) says which version it is."""

from __future__ import annotations

import ast
from pathlib import Path

from training.records.gen_record import RECORD_FORMAT, record_problem

ROOT = Path(__file__).resolve().parents[1]


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
