"""One writer per output folder: a second hidden-states, build-mix or generate on the same --out is
refused in one line naming the live writer's PID; a dead writer's lock is taken over; a finished run
leaves no lock file; merge_index never removes the index part of a writer that is still running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from curator.cli import main
from curator.rows.schema import MANIFEST
from tests.fakes.openai_server import FakeOpenAIServer, write_mix

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> bool:
    """Return True once `path` holds something, False when the process ended first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size > 0:
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.002)
    raise AssertionError(f"{path} did not appear")


def _one_line_error(err: str) -> str:
    return " ".join(err.split())


@pytest.mark.slow
def test_a_second_hidden_states_run_on_one_out_is_refused_naming_the_pid(
    tiny_target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.training.capture.test_hidden_states import conversation, write_gen
    from training.errors import StoreError
    from training.storage.reader import HiddenStateStore

    gen = write_gen(tmp_path / "gen", [conversation(i) for i in range(40)], per_shard=10)
    store = tmp_path / "store"
    args = ["hidden-states", "--model", str(tiny_target), "--data", str(gen), "--out", str(store)]
    first = subprocess.Popen([sys.executable, "-m", "curator", *args], cwd=ROOT, env=ENV,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert _wait_for(store / ".hidden-states.lock", first), "the first run took no lock on its --out"
        first.send_signal(signal.SIGSTOP)  # a live writer, frozen mid-run
        capsys.readouterr()
        assert main(args) == 1
        err = _one_line_error(capsys.readouterr().err)
        assert f"PID {first.pid}" in err and "curator hidden-states" in err and "Traceback" not in err
        with pytest.raises(StoreError, match=f"being written .*PID {first.pid}"):
            HiddenStateStore.open(store)  # readers wait for the capture to finish, too
        first.send_signal(signal.SIGCONT)
        assert first.wait(120) == 0, first.stderr.read().decode()
    finally:
        first.kill()
        first.wait()
        first.stderr.close()
    assert not (store / ".hidden-states.lock").exists()
    assert len(HiddenStateStore.open(store)) == 40
    assert list((store / "index-parts").iterdir()) == []


def test_a_dead_writers_lock_is_taken_over(tiny_target: Path, tmp_path: Path) -> None:
    from tests.training.capture.test_hidden_states import conversation, write_gen

    gen = write_gen(tmp_path / "gen", [conversation(i) for i in range(3)])
    store = tmp_path / "store"
    store.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (store / ".hidden-states.lock").write_text(f"{dead.pid} somehost\n")  # left by a killed run
    assert main(["hidden-states", "--model", str(tiny_target), "--data", str(gen), "--out", str(store)]) == 0
    assert not (store / ".hidden-states.lock").exists()


def test_merge_index_keeps_the_part_of_a_writer_still_running(tmp_path: Path) -> None:
    from tests.training.storage.test_store import meta, sample
    from training.storage.index import merge_index
    from training.storage.reader import HiddenStateStore
    from training.storage.writer import StoreWriter

    live = StoreWriter(tmp_path, meta(), shard_max_bytes=1)  # every sample is flushed as its own shard
    live.add(sample(0))
    part = tmp_path / "index-parts" / f"{live.writer_id}.json"
    assert part.exists()
    merge_index(tmp_path)  # another process finishing while `live` still writes
    assert part.exists()
    live.add(sample(1))
    live.close()
    merge_index(tmp_path)
    assert not part.exists()
    assert HiddenStateStore.open(tmp_path).ids() == ["s0", "s1"]


BLOCKING_BUILD = """
import sys, time
from pathlib import Path
from curator.mix import build_mix, load_recipe

class Hold:
    def source_started(self, name, quota):
        Path(sys.argv[3]).write_text("started")
        while not Path(sys.argv[4]).exists():
            time.sleep(0.01)
    def rows_read(self, name, read): pass
    def source_done(self, report): pass

build_mix(load_recipe(sys.argv[1]), sys.argv[2], progress=Hold())
"""


def test_a_second_build_mix_on_one_out_is_refused_naming_the_pid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [{"conversations": [{"from": "human", "value": f"question {i}"}, {"from": "gpt", "value": "a"}]} for i in range(30)]
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("name: two-writers\nsources:\n  - path: chat.jsonl\n    samples: 20\n")
    out, started, go = tmp_path / "mix", tmp_path / "started", tmp_path / "go"
    first = subprocess.Popen([sys.executable, "-c", BLOCKING_BUILD, str(recipe), str(out), str(started), str(go)],
                             cwd=ROOT, env=ENV, stderr=subprocess.PIPE)
    try:
        assert _wait_for(started, first)
        capsys.readouterr()
        assert main(["build-mix", "--recipe", str(recipe), "--out", str(out), "--catalog", str(tmp_path / "c.duckdb")]) == 1
        err = _one_line_error(capsys.readouterr().err)
        assert f"PID {first.pid}" in err and "curator build-mix" in err
        go.write_text("go")
        assert first.wait(60) == 0, first.stderr.read().decode()
    finally:
        first.kill()
        first.wait()
        first.stderr.close()
    assert not (out / ".build-mix.lock").exists()
    assert json.loads((out / MANIFEST).read_text())["rows"] == 20


def test_a_finished_generate_leaves_no_lock_file(tmp_path: Path) -> None:
    mix = write_mix(tmp_path / "mix", [{"id": "q", "messages": [{"role": "user", "content": "hi"}]}])
    with FakeOpenAIServer() as server:
        assert main(["generate", "--mix", str(mix), "--out", str(tmp_path / "gen"), "--model", "target",
                     "--endpoint", server.url, "--catalog", str(tmp_path / "c.duckdb")]) == 0
    assert not (tmp_path / "gen" / ".generate.lock").exists()
