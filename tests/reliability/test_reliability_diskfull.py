"""A full disk is said as such in every stage: "disk full at PATH: N bytes free", one line, and the
stage's temporaries are gone. Each stage runs with its output on a real tiny filesystem (a tmpfs
mounted in a private user+mount namespace); skipped where the system does not allow one."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes.openai_server import FakeOpenAIServer, write_mix

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
# Mounts a tmpfs of $1 bytes at $2, runs the rest, then lists what is left on it.
SMALL_DISK = 'size=$1 dir=$2; shift 2; mount -t tmpfs -o size=$size tmpfs "$dir" || exit 99; ' \
             '"$@"; echo "rc=$?"; echo "left: $(ls -A "$dir"/* "$dir" 2>/dev/null | tr "\\n" " ")"'


def _small_disk_works() -> bool:
    try:
        probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                               capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


pytestmark = pytest.mark.skipif(not _small_disk_works(), reason="needs unshare -rm and tmpfs mounts")


def on_small_disk(size: str, disk: Path, *argv: str) -> tuple[int, str, str]:
    """Return (exit status, stderr as one line, what is left on the disk) of `argv` run with `disk` mounted small."""
    disk.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", SMALL_DISK, "sh", size, str(disk), *argv],
                          cwd=ROOT, env=ENV, capture_output=True, timeout=300, text=True)
    out = proc.stdout.splitlines()
    rc = int(next(line for line in out if line.startswith("rc="))[3:])
    left = next(line for line in out if line.startswith("left:"))[5:]
    return rc, " ".join(proc.stderr.split()), left


def _says_disk_full(err: str, path: Path) -> bool:
    # Compared without whitespace: the console wraps a long line wherever it likes.
    return f"diskfullat{path}:" in "".join(err.split()) and " bytes free" in err


def _assert_disk_full(rc: int, err: str, path: Path) -> None:
    assert rc == 1, err
    assert _says_disk_full(err, path), err
    assert "unexpected" not in err and "Traceback" not in err and "report" not in err


def _chat_recipe(folder: Path, name: str, samples: int) -> Path:
    rng = random.Random(0)
    words = [f"w{i}" for i in range(20000)]
    rows = [{"conversations": [{"from": "human", "value": " ".join(rng.choice(words) for _ in range(200))}]}
            for _ in range(samples)]
    (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = folder / f"{name}.yaml"
    recipe.write_text(f"name: {name}\nrows_per_part: 500\nsources:\n  - path: {name}.jsonl\n    samples: {samples}\n"
                      "dedup: {exact: true, near: false}\n")
    return recipe


def test_build_mix_on_a_full_disk(tmp_path: Path) -> None:
    recipe = _chat_recipe(tmp_path, "full", 2000)
    disk = tmp_path / "disk"
    rc, err, left = on_small_disk("256k", disk, sys.executable, "-m", "curator", "build-mix", "--recipe", str(recipe),
                                  "--out", str(disk / "mix"), "--catalog", str(tmp_path / "c.duckdb"))
    _assert_disk_full(rc, err, disk / "mix")
    assert ".part-" not in left and "manifest.json" not in left  # no temporaries filling the disk, no mix


@pytest.mark.slow
def test_a_rebuild_stopped_by_a_full_disk_keeps_the_old_mix(tmp_path: Path) -> None:
    small, big = _chat_recipe(tmp_path, "small", 40), _chat_recipe(tmp_path, "big", 2000)
    disk = tmp_path / "disk"
    build = f"{sys.executable} -m curator build-mix --out {disk / 'mix'} --catalog {tmp_path / 'c.duckdb'} --recipe"
    check = f"{sys.executable} -c \"from curator.mix import read_manifest; print('rows', read_manifest('{disk / 'mix'}')['rows'])\""
    rc, err, _ = on_small_disk("256k", disk, "sh", "-c", f"{build} {small} && ! {build} {big} && {check} >&2")
    assert rc == 0, err
    assert _says_disk_full(err, disk / "mix") and "rows 40" in err


@pytest.mark.slow
def test_generate_on_a_full_disk(tmp_path: Path) -> None:
    mix = write_mix(tmp_path / "mix", [{"id": f"q{i:05d}", "messages": [{"role": "user", "content": "x" * 60 + str(i)}]}
                                       for i in range(2000)])
    disk = tmp_path / "disk"
    with FakeOpenAIServer() as server:
        rc, err, left = on_small_disk("64k", disk, sys.executable, "-m", "curator", "generate", "--mix", str(mix),
                                      "--out", str(disk / "gen"), "--model", "target", "--endpoint", server.url,
                                      "--catalog", str(tmp_path / "c.duckdb"))
    _assert_disk_full(rc, err, disk / "gen")
    assert ".tmp-" not in left


@pytest.mark.slow
def test_hidden_states_on_a_full_disk(tiny_target: Path, tmp_path: Path) -> None:
    from tests.training.capture.test_hidden_states import conversation, write_gen

    gen = write_gen(tmp_path / "gen", [conversation(i) for i in range(6)])
    disk = tmp_path / "disk"
    rc, err, left = on_small_disk("64k", disk, sys.executable, "-m", "curator", "hidden-states", "--model",
                                  str(tiny_target), "--data", str(gen), "--out", str(disk / "store"), "--force")
    _assert_disk_full(rc, err, disk / "store" / "shards")
    assert ".tmp" not in left


def test_a_torch_save_cut_short_by_a_full_disk_is_named(tmp_path: Path) -> None:
    # torch.save reports a full disk as RuntimeError("... unexpected pos ..."): the checkpoint
    # writer wraps its save in named_disk_full to say what happened.
    script = ("import sys, torch; from pathlib import Path; from training.io.diskspace import named_disk_full\n"
              "d = Path(sys.argv[1])\n"
              "with named_disk_full(d):\n    torch.save({'w': torch.zeros(1 << 18)}, d / 'state.pt')\n")
    disk = tmp_path / "disk"
    rc, err, _ = on_small_disk("256k", disk, sys.executable, "-c", script, str(disk))
    assert rc == 1 and "DiskFullError" in err and _says_disk_full(err, disk)


def test_a_safetensors_file_cut_short_by_a_full_disk_is_named(tmp_path: Path) -> None:
    # safetensors' writer reports a full disk as SafetensorError("... (os error 28)"), which is
    # neither an OSError nor a RuntimeError: the stages that save_file (checkpoints) must still say it.
    script = ("import sys, torch; from pathlib import Path; from safetensors.torch import save_file\n"
              "from training.io.diskspace import named_disk_full\n"
              "d = Path(sys.argv[1])\n"
              "with named_disk_full(d):\n    save_file({'w': torch.zeros(1 << 18)}, str(d / 'model.safetensors'))\n")
    disk = tmp_path / "disk"
    rc, err, _ = on_small_disk("256k", disk, sys.executable, "-c", script, str(disk))
    assert rc == 1 and "DiskFullError" in err and _says_disk_full(err, disk)


def test_a_catalog_on_a_full_disk_still_reads_and_names_the_full_disk_on_a_write(tmp_path: Path) -> None:
    # issue 38 item 11: even SELECT and `catalog list` failed with "its schema cannot be brought up to
    # date ... move the file aside to start a new catalog", advice that throws the catalog away.
    disk = tmp_path / "disk"
    cat = disk / "c.duckdb"
    make = (f"{sys.executable} -c \"from curator.catalog import Catalog; c = Catalog.open('{cat}'); "
            "c.upsert_dataset({'dataset_id': 'org/set'}); "
            "c.add_candidate('run', 'agent', 'org/set', 'chat', 0.9, 'why', 100)\"")
    fill = f"dd if=/dev/zero of={disk / 'fill'} bs=4096 2>/dev/null; sync"
    curator = f"{sys.executable} -m curator"
    steps = (f"{make} && {fill}; "
             f"{curator} catalog list --catalog {cat} >&2; echo list=$? >&2; "
             f"{curator} sql --catalog {cat} 'SELECT count(*) AS n FROM candidates' >&2; echo sql=$? >&2; "
             f"{curator} catalog approve 1 --catalog {cat}; echo approve=$? >&2; "
             f"rm {disk / 'fill'}; {curator} catalog approve 1 --catalog {cat} >&2; echo after=$? >&2")
    rc, err, _ = on_small_disk("4m", disk, "sh", "-c", steps)
    assert "list=0" in err and "org/set" in err, err
    assert "sql=0" in err, err
    assert "approve=1" in err and _says_disk_full(err, cat), err
    assert "move the file aside" not in err and "unexpected" not in err, err
    assert "after=0" in err and "approved" in err, err  # space freed: the same catalog takes the write
