"""Every stage removes its own crash leftovers when it starts, and never counts them as output:
the store's temporaries and unindexed shards, a killed build's mix parts, checkpoint temporaries."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from curator.cli import main
from curator.rows.schema import MANIFEST
from tests.reliability.test_reliability_publish import KILL_AFTER_RENAMES  # the same kill point: after the k-th part rename

ROOT = Path(__file__).resolve().parents[2]


def test_store_leftovers_are_not_counted_and_are_removed_by_the_next_run(tiny_target: Path, tmp_path: Path) -> None:
    from tests.training.capture.test_hidden_states import conversation, write_gen
    from training.storage.reader import HiddenStateStore

    store = tmp_path / "store"
    args = ["hidden-states", "--model", str(tiny_target), "--out", str(store)]
    assert main([*args, "--data", str(write_gen(tmp_path / "gen3", [conversation(i) for i in range(3)]))]) == 0
    shards = store / "shards"
    real = sorted(shards.glob("*.safetensors"))
    real_bytes = sum(p.stat().st_size for p in real)
    # What a run killed mid-shard, or between a shard's rename and its index write, leaves behind.
    leftovers = [
        shards / ".20990101T000000000000-r0-dead00-00000.safetensors.tmp",
        shards / "20990101T000000000000-r0-dead00-00001.safetensors",
        store / ".index.json.tmp-999-dead00",
        store / "index-parts" / ".20990101T000000000000-r0-dead00.json.tmp-999-dead00",
    ]
    for path in leftovers:
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(real[0], path)
    assert HiddenStateStore.open(store).disk_bytes() == real_bytes

    assert main([*args, "--data", str(write_gen(tmp_path / "gen5", [conversation(i) for i in range(5)]))]) == 0
    assert not any(p.exists() for p in leftovers)
    reopened = HiddenStateStore.open(store)
    assert sorted(reopened.ids()) == [f"c{i:03d}" for i in range(5)]
    assert reopened.disk_bytes() == sum(p.stat().st_size for p in shards.glob("*.safetensors"))




def test_a_killed_builds_parts_are_removed_by_the_next_build(tmp_path: Path) -> None:
    rows = [{"conversations": [{"from": "human", "value": f"question {i} about queues"}, {"from": "gpt", "value": "a"}]}
            for i in range(300)]
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("name: stale\nrows_per_part: 20\nsources:\n  - path: chat.jsonl\n    samples: 200\n")
    out = tmp_path / "mix"
    args = ["build-mix", "--recipe", str(recipe), "--out", str(out), "--catalog", str(tmp_path / "c.duckdb")]
    killed = subprocess.run([sys.executable, "-c", KILL_AFTER_RENAMES, "3", *args], cwd=ROOT, capture_output=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()
    assert list(tmp_path.glob(".mix.build.tmp-*/.part-*"))  # its staging folder, beside the mix
    assert main(args) == 0
    manifest = json.loads((out / MANIFEST).read_text())
    assert sorted(p.name for p in out.iterdir()) == sorted([p["file"] for p in manifest["parts"]] + [".curator"])
    assert not list(tmp_path.glob(".mix.*"))  # staging folder and lock gone


def test_checkpoint_temporaries_of_an_interrupted_save_are_removed(tmp_path: Path) -> None:
    from training.io.tempfiles import remove_stale_checkpoints

    checkpoints = tmp_path / "run" / "checkpoints"
    (checkpoints / "step-0000005").mkdir(parents=True)
    (checkpoints / "step-0000005" / "draft.safetensors").write_bytes(b"x" * 100)
    (checkpoints / "latest.json").write_text('{"name": "step-0000005", "step": 5}')
    interrupted = checkpoints / ".step-0000010.a1b2c3.tmp"
    interrupted.mkdir()
    (interrupted / "draft.safetensors").write_bytes(b"y" * 100)
    assert remove_stale_checkpoints(checkpoints) == [interrupted]
    assert sorted(p.name for p in checkpoints.iterdir()) == ["latest.json", "step-0000005"]
