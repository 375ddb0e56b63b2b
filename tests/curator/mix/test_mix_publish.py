"""What build-mix may touch and what readers see: glob readers never see two mixes, --out never loses
files build-mix did not write, and the summary survives hostile names and an 80-column terminal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import duckdb
import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml
from rich.console import Console

from curator.cli import main
from curator.mix import build_mix, open_mix, recipe_from_dict
from curator.rows.formats.table import FORMATS, aliases
from curator.mix.recipe import load_recipe
from tests.reliability.test_reliability_publish import KILL_AFTER_RENAMES  # SIGKILL after the k-th part rename

ROOT = Path(__file__).resolve().parents[3]
# Runs the CLI as a system without renameat2 would (old folder renamed aside, then the new one into
# place), with SIGKILL right after the old mix is renamed aside.
KILL_WHEN_ASIDE = """
import os, signal, sys
import training.io.publish as folder_publish
real = os.rename
def rename(src, dst, *args, **kwargs):
    real(src, dst, *args, **kwargs)
    if ".old.tmp-" in os.path.basename(str(dst)):
        os.kill(os.getpid(), signal.SIGKILL)
os.rename, folder_publish.exchange = rename, lambda a, b: False
from curator.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _recipe(folder: Path, seed: int, samples: int = 400, name: str = "publish") -> Path:
    recipe = {"name": name, "seed": seed, "rows_per_part": 20, "dedup": {"exact": True, "near": False},
              "sources": [{"path": "chat.jsonl", "name": "chat", "samples": samples}]}
    path = folder / f"recipe-{seed}.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    rows = [{"id": f"q{i:04d}", "conversations": [{"from": "human", "value": f"question {i} about sockets"},
                                                 {"from": "gpt", "value": "a"}]} for i in range(600)]
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def _build(folder: Path, recipe: Path, out: Path, *extra: str) -> int:
    return main(["build-mix", "--recipe", str(recipe), "--out", str(out), "--catalog", str(folder / "c.duckdb"), *extra])


def _killed(folder: Path, recipe: Path, out: Path, k: int) -> None:
    """Run build-mix killed after its k-th part rename, or (k = 0) once the old mix is renamed aside."""
    script = [KILL_WHEN_ASIDE] if k == 0 else [KILL_AFTER_RENAMES, str(k)]
    proc = subprocess.run([sys.executable, "-c", *script, "build-mix", "--recipe", str(recipe), "--out",
                           str(out), "--catalog", str(folder / "c.duckdb")], cwd=ROOT, capture_output=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()


def _read_backs(mix: Path) -> list[list[str]]:
    import datasets

    return [sorted(duckdb.sql(f"SELECT id FROM '{mix}/*.parquet'").fetchnumpy()["id"].tolist()),
            sorted(pd.read_parquet(mix)["id"]),
            sorted(datasets.load_dataset("parquet", data_dir=str(mix), split="train")["id"])]


def test_glob_readers_see_the_old_mix_whole_after_a_rebuild_killed_mid_publish(folder: Path) -> None:
    mix = folder / "mix"
    assert _build(folder, _recipe(folder, 0), mix) == 0
    old = sorted(open_mix(mix).ids())
    _killed(folder, _recipe(folder, 1), mix, k=5)  # 5 of the new mix's 20 parts renamed when killed
    assert _read_backs(mix) == [old, old, old]
    assert _build(folder, _recipe(folder, 1), mix) == 0  # the next build cleans up and publishes
    new = sorted(open_mix(mix).ids())
    assert new != old and _read_backs(mix) == [new, new, new]
    assert not list(folder.glob(".mix.*"))


def test_a_build_killed_between_the_two_renames_of_a_swap_gets_its_old_mix_back(folder: Path) -> None:
    mix = folder / "mix"
    assert _build(folder, _recipe(folder, 0), mix) == 0
    old = sorted(open_mix(mix).ids())
    _killed(folder, _recipe(folder, 1), mix, k=0)  # the old mix renamed aside, the new one not yet in place
    assert not mix.exists()  # a reader finds no mix, never a mixture
    from curator.mix import publish

    publish.remove_stale(mix)  # what the next build does first, holding the lock
    assert sorted(open_mix(mix).ids()) == old and not list(folder.glob(".mix.*.tmp-*"))


def test_out_that_holds_files_build_mix_did_not_write_is_refused_and_kept(folder: Path, capsys) -> None:
    out = folder / "spark"
    out.mkdir()
    spark = out / "part-00000-c000.snappy.parquet"
    spark.write_bytes(b"PAR1 not ours")
    assert _build(folder, _recipe(folder, 0), out) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "holds no mix" in err and "part-00000-c000.snappy.parquet" in err and "never deleted" in err
    assert spark.read_bytes() == b"PAR1 not ours" and sorted(p.name for p in out.iterdir()) == [spark.name]
    mix = folder / "mix"
    assert _build(folder, _recipe(folder, 0), mix) == 0
    (mix / "notes.txt").write_text("mine")  # a file added to a finished mix
    assert _build(folder, _recipe(folder, 1), mix) == 1
    assert "holds files build-mix did not write (notes.txt)" in " ".join(capsys.readouterr().err.split())
    assert (mix / "notes.txt").read_text() == "mine"
    empty = folder / "empty"
    empty.mkdir()
    assert _build(folder, _recipe(folder, 0), empty) == 0


def test_a_recipe_name_with_markup_does_not_crash_the_summary(folder: Path, capsys) -> None:
    assert _build(folder, _recipe(folder, 0, 10, name="[/]m[red]"), folder / "mix") == 0
    assert "mix [/]m[red]" in capsys.readouterr().out


def test_the_summary_keeps_names_and_headers_whole_at_80_columns(folder: Path) -> None:
    from curator.commands.mix import Records, summary_rows

    names = ["nebius/SWE-agent-trajectories", "local/agentic-traces-2025-06.jsonl", "HuggingFaceH4/ultrachat_200k"]
    for name in names:
        (folder / f"{name.replace('/', '_')}.jsonl").write_text((folder / "chat.jsonl").read_text())
    recipe = recipe_from_dict({"name": "wide", "sources": [
        {"path": str(folder / f"{n.replace('/', '_')}.jsonl"), "name": n, "samples": 100_000, "category": "agentic"}
        for n in names]})
    manifest = build_mix(recipe, folder / "mix")
    columns, rows = summary_rows(manifest)
    console = Console(width=80, record=True, file=open(os.devnull, "w"))
    console.print(Records(columns, rows, "mix wide"))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    for word in [*names, *columns, "100,000", "99,400"]:
        assert word in text, word
    wide = Console(width=200, record=True, file=open(os.devnull, "w"))
    wide.print(Records(columns, rows, "mix wide"))
    wide_text = wide.export_text()
    assert all(name in wide_text for name in names) and "┃" in wide_text  # a table where it fits


def test_rows_keep_their_source_id_beside_the_mix_id(folder: Path) -> None:
    build_mix(load_recipe(_recipe(folder, 0, 5)), folder / "mix")
    table = pq.read_table(sorted((folder / "mix").glob("*.parquet"))).to_pylist()
    for row in table:
        assert row["source_id"] == f"q{int(row['id'].split(':')[1]):04d}"


def test_every_normaliser_and_alias_is_a_recipe_format() -> None:
    for name in [*FORMATS, *aliases()]:
        spec = {"path": "x.jsonl", "samples": 1, "format": name}
        recipe_from_dict({"name": "f", "sources": [spec]})
    assert {"deepswe", "hermes", "apigen", "hermes-function-calling"} <= {*FORMATS, *aliases()}


def test_an_out_that_is_a_link_keeps_its_link_and_the_mix_lands_where_it_points(folder: Path) -> None:
    (folder / "disk").mkdir()
    link = folder / "mix"
    link.symlink_to(folder / "disk" / "mix")
    assert _build(folder, _recipe(folder, 0, 10), link) == 0
    assert _build(folder, _recipe(folder, 1, 10), link) == 0  # a rebuild swaps the folder it points to
    assert link.is_symlink() and len(open_mix(link).ids()) == 10 and (folder / "disk" / "mix" / ".curator").is_dir()
