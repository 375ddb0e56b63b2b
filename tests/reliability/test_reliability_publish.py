"""A mix is published whole: a build killed at any rename leaves the old mix readable as it was (or
no mix), and `curator generate` refuses a folder that holds no finished mix, saying how to rebuild."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from curator.cli import main
from tests.fakes.openai_server import FakeOpenAIServer

ROOT = Path(__file__).resolve().parents[2]
# Runs the CLI with os.replace wrapped: SIGKILL right after the K-th rename of a part file.
KILL_AFTER_RENAMES = """
import os, signal, sys
real, count, k = os.replace, [0], int(sys.argv[1])
def replace(src, dst, *args, **kwargs):
    real(src, dst, *args, **kwargs)
    if os.path.basename(str(dst)).startswith("part-"):
        count[0] += 1
        if count[0] == k:
            os.kill(os.getpid(), signal.SIGKILL)
os.replace = replace
from curator.cli import main
sys.exit(main(sys.argv[2:]))
"""


def _recipe(folder: Path, seed: int, samples: int) -> Path:
    path = folder / f"recipe-{seed}.yaml"
    path.write_text(f"name: kill-test\nseed: {seed}\nrows_per_part: 20\nsources:\n"
                    f"  - path: chat.jsonl\n    name: chat\n    samples: {samples}\ndedup: {{exact: true, near: false}}\n")
    return path


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    rows = [{"conversations": [{"from": "human", "value": f"question {i} about sockets"}, {"from": "gpt", "value": "a"}]}
            for i in range(600)]
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def _build_killed_after(folder: Path, recipe: Path, out: Path, renames: int) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", KILL_AFTER_RENAMES, str(renames), "build-mix", "--recipe", str(recipe), "--out", str(out),
         "--catalog", str(folder / "c.duckdb")],
        cwd=ROOT, capture_output=True, timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()


def _generate(folder: Path, mix: Path, out: Path, server: FakeOpenAIServer) -> int:
    return main(["generate", "--mix", str(mix), "--out", str(out), "--model", "target", "--endpoint", server.url,
                 "--catalog", str(folder / "c.duckdb")])


def _generated_ids(out: Path) -> set[str]:
    return {json.loads(line)["id"] for p in out.glob("shard-*.jsonl") for line in p.read_text().splitlines()}


def _mix_ids(mix: Path) -> set[str]:
    return {i for p in mix.glob("part-*.parquet") for i in pq.read_table(p, columns=["id"]).column(0).to_pylist()}


def test_a_rebuild_killed_after_5_of_20_renames_leaves_the_old_mix_whole(folder: Path) -> None:
    mix = folder / "mix"
    assert main(["build-mix", "--recipe", str(_recipe(folder, 0, 400)), "--out", str(mix),
                 "--catalog", str(folder / "c.duckdb")]) == 0
    old_ids = _mix_ids(mix)
    assert len(old_ids) == 400
    _build_killed_after(folder, _recipe(folder, 1, 400), mix, renames=5)
    with FakeOpenAIServer() as server:
        assert _generate(folder, mix, folder / "gen", server) == 0
    # What generate read is the old mix, every row of it, and nothing of the killed build.
    assert _generated_ids(folder / "gen") == old_ids


def test_a_first_build_killed_midway_is_refused_by_generate_with_how_to_rebuild(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mix = folder / "mix"
    _build_killed_after(folder, _recipe(folder, 0, 400), mix, renames=5)
    assert list(folder.glob(".mix.build.tmp-*/.part-*")) and not mix.exists()  # parts of the killed build lie beside...
    capsys.readouterr()
    with FakeOpenAIServer() as server:
        code = _generate(folder, mix, folder / "gen", server)
    err = capsys.readouterr().err
    assert code == 1 and "curator build-mix" in err and "Traceback" not in err  # ...and never read as a mix
    assert not _generated_ids(folder / "gen")


def test_a_part_changed_after_the_build_is_refused(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mix = folder / "mix"
    assert main(["build-mix", "--recipe", str(_recipe(folder, 0, 100)), "--out", str(mix),
                 "--catalog", str(folder / "c.duckdb")]) == 0
    part = sorted(mix.glob("part-*.parquet"))[0]
    table = pq.read_table(part)
    pq.write_table(table.slice(0, 3), part)  # a part swapped for another one with fewer rows
    capsys.readouterr()
    with FakeOpenAIServer() as server:
        code = _generate(folder, mix, folder / "gen", server)
    err = "".join(capsys.readouterr().err.split())  # the console wraps long lines
    assert code == 1 and part.name in err and "curatorbuild-mix" in err
