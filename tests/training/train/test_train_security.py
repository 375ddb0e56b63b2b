"""Training under hostile input, a second writer, divergence and a full disk: refused by name, nothing
run, nothing non-finite kept, nothing logged twice."""

from __future__ import annotations

import json
import math
import os
import pickle
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from curator.cli import main
from curator.mix.recipe import load_recipe
from tests.reliability.test_reliability_diskfull import _small_disk_works
from tests.training.train.test_trainer import make_store, read_metrics, tiny_config
from training.train.checkpoint import TRAINER_STATE, latest_checkpoint
from training.errors import ConfigFileError, DivergedError, StoreIntegrityError, TrainingError
from training.io.outlock import OutputBusyError
from training.storage.index import read_index
from training.train.config import TrainConfig, load_run_config
from training.train.trainer import run_lock, train

ROOT = Path(__file__).resolve().parents[3]
# Nine strings, nine levels of nine aliases each: 9^6 = 531,441 strings from a few hundred bytes.
LAUGHS = "".join(
    [f'{chr(97)}: &{chr(97)} ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n']
    + [f"{chr(97 + k)}: &{chr(97 + k)} [{','.join([f'*{chr(96 + k)}'] * 9)}]\n" for k in range(1, 6)]
)


@pytest.fixture(scope="module")
def store(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_store(tiny_target, tmp_path_factory.mktemp("store"), n=20)


@pytest.fixture(scope="module")
def stopped_run(store: Path, tiny_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of 4 steps stopped after 2, with its checkpoint at step 2."""
    out = tmp_path_factory.mktemp("stopped") / "run"
    train(run_config(store, tiny_target, out), stop_after_steps=2)
    return out


def run_config(store: Path, target: Path, out: Path) -> TrainConfig:
    """The config of `stopped_run` (a resume must use the same)."""
    return tiny_config(store, target, out, max_steps=4, log_every=2, eval_fraction=0.3)


def copy_run(run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(run, tmp_path / "run"))


class CreatesAFile:
    """Unpickling this creates `path`: what a planted trainer_state.pt would do on --resume."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):  # noqa: ANN204 - the pickle protocol
        return (open, (self.path, "w"))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("writer", ["torch.save", "pickle"])
def test_a_planted_trainer_state_does_not_run_on_resume(stopped_run: Path, store: Path, tiny_target: Path,
                                                        tmp_path: Path, writer: str) -> None:
    run = copy_run(stopped_run, tmp_path)
    planted = latest_checkpoint(run) / TRAINER_STATE
    marker = tmp_path / "pwned"
    if writer == "torch.save":
        torch.save({"optimizer": CreatesAFile(marker)}, planted)
    else:
        planted.write_bytes(pickle.dumps(CreatesAFile(marker)))
    with pytest.raises(TrainingError, match="holds objects other than tensors .* refusing it.* start a new run"):
        train(run_config(store, tiny_target, run), resume=True)
    assert not marker.exists()


def test_a_second_run_into_the_same_out_is_refused_naming_the_holder(stopped_run: Path, store: Path,
                                                                     tiny_target: Path, tmp_path: Path) -> None:
    run = copy_run(stopped_run, tmp_path)
    cfg = run_config(store, tiny_target, run)
    before = {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()}
    with run_lock(run):  # a live run holds `out` (flock: a second open of the file is another holder)
        with pytest.raises(OutputBusyError, match=f"being written by another `curator train` \\(PID {os.getpid()} on"):
            train(cfg, resume=True)
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()} == before  # nothing touched
    assert train(cfg, resume=True).step == 4  # once the holder is gone the run goes on
    assert not (run / ".train.lock").exists()


def test_a_diverging_run_stops_by_name_and_keeps_only_finite_checkpoints(store: Path, tiny_target: Path,
                                                                         tmp_path: Path) -> None:
    run = tmp_path / "run"
    with pytest.raises(DivergedError, match=r"training diverged: the loss .*NaN/inf between steps \d+ and \d+ \(lr [0-9.]+e\+(29|30)\)"):
        train(tiny_config(store, tiny_target, run, lr=1e30, warmup_ratio=0.0, max_steps=8, log_every=4, save_every=1))
    saved = sorted((run / "checkpoints").glob("step-*"))
    assert saved, "the steps before the divergence were checkpointed"
    for ckpt in saved:
        assert all(bool(torch.isfinite(t).all()) for t in load_file(str(ckpt / "draft.safetensors")).values()
                   if t.is_floating_point())
    assert not (run / "summary.json").exists()
    logged = read_metrics(run) if (run / "metrics.jsonl").exists() else []
    assert all(math.isfinite(r["loss"]) for r in logged)  # nothing non-finite was logged either


def test_curator_train_says_diverged_in_one_line(store: Path, tiny_target: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["train", f"data={store}", f"target={tiny_target}", f"out={tmp_path / 'run'}", "lr=1e30",
                 "max_steps=4", "log_every=2", "global_batch_size=8", "micro_batch_size=4", "draft_vocab_size=512",
                 "ttt_steps=2", "warmup_ratio=0.0"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err and "unexpected" not in err
    assert "error: training diverged" in err


def test_nan_states_in_a_store_stop_training_naming_the_sample(store: Path, tiny_target: Path, tmp_path: Path) -> None:
    bad = Path(shutil.copytree(store, tmp_path / "store"))
    sid = "s0003"
    entry = read_index(bad)[0][sid]
    shard = bad / "shards" / entry["shard"]
    tensors = load_file(str(shard))
    tensors["aux"][entry["offset"] + 1, 5] = float("nan")
    save_file(tensors, str(shard), metadata={"format": "curator-hidden-states/1"})
    with pytest.raises(StoreIntegrityError, match=f"sample\\(s\\) '{sid}' hold NaN/inf hidden states"):
        train(tiny_config(bad, tiny_target, tmp_path / "run", max_steps=6, log_every=2, eval_fraction=0.0))
    assert not (tmp_path / "run" / "summary.json").exists()


def test_resuming_a_finished_run_logs_nothing_again(stopped_run: Path, store: Path, tiny_target: Path,
                                                    tmp_path: Path) -> None:
    run = copy_run(stopped_run, tmp_path)
    cfg = run_config(store, tiny_target, run)
    first = train(cfg, resume=True)
    log = (run / "metrics.jsonl").read_text()
    assert [r["split"] for r in read_metrics(run)].count("eval") == 1
    again = [train(cfg, resume=True) for _ in range(2)]
    assert (run / "metrics.jsonl").read_text() == log
    assert all(r.step == 4 and r.eval == first.eval and r.train == first.train for r in again)


def test_a_train_yaml_with_aliases_is_refused_at_once(tmp_path: Path) -> None:
    path = tmp_path / "train.yaml"
    path.write_text(LAUGHS + "data: *f\ntarget: t\nout: o\n")
    t0 = time.perf_counter()
    with pytest.raises(TrainingError, match="train.yaml: line 2 not valid YAML: uses the alias \\*a: aliases") as caught:
        load_run_config(path)
    assert time.perf_counter() - t0 < 1.0 and len(str(caught.value)) < 400


def test_a_recipe_with_aliases_is_refused_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text(LAUGHS + "name: *f\nsources: []\n")
    with pytest.raises(ConfigFileError, match="line 2 not valid YAML: uses the alias \\*a"):
        load_recipe(path)


def test_a_long_value_of_the_wrong_type_is_not_copied_into_the_error(tmp_path: Path) -> None:
    path = tmp_path / "train.json"
    path.write_text(json.dumps({"lr": ["x"] * 100_000, "data": "d", "target": "t", "out": "o"}))
    with pytest.raises(TrainingError, match="'lr' must be float, got a list of 100000 items"):
        load_run_config(path)


def test_save_checkpoint_refuses_non_finite_weights_unless_its_caller_checked_them(tmp_path: Path) -> None:
    from training.train.checkpoint import save_checkpoint
    from training.eagle3.model import DraftConfig, Eagle3Draft

    cfg = DraftConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                      vocab_size=512, draft_vocab_size=512)
    draft = Eagle3Draft(cfg)
    with torch.no_grad():
        draft.fc.weight[0, 0] = float("nan")
    with pytest.raises(DivergedError, match=r"hold NaN/inf \(fc.weight\) at step 1"):
        save_checkpoint(tmp_path, draft.trainable_state_dict(), {"step": 1}, None)
    assert latest_checkpoint(tmp_path) is None and not (tmp_path / "checkpoints").exists()
    # the trainer checks the weights itself right before saving, and asks for no second check
    assert save_checkpoint(tmp_path, draft.trainable_state_dict(), {"step": 1}, None, check_finite=False).name == "step-0000001"


@pytest.mark.skipif(not _small_disk_works(), reason="needs unshare -rm and tmpfs mounts")
def test_a_checkpoint_cut_short_by_a_full_disk_is_named(tmp_path: Path) -> None:
    # the draft's weights (~700 KB of float32) do not fit a 256 KB disk: safetensors fails first
    script = ("import sys; from pathlib import Path\n"
              "from training.train.checkpoint import save_checkpoint\n"
              "from training.eagle3.model import DraftConfig, Eagle3Draft\n"
              "cfg = DraftConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,"
              " vocab_size=512, draft_vocab_size=512)\n"
              "save_checkpoint(Path(sys.argv[1]), Eagle3Draft(cfg).trainable_state_dict(), {'step': 1}, None)\n")
    disk = tmp_path / "disk"
    disk.mkdir()
    shell = 'mount -t tmpfs -o size=256k tmpfs "$1" || exit 99; shift; "$@"; echo "rc=$?"; ls -A "$1"/checkpoints'
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", shell, "sh", str(disk), sys.executable, "-c", script,
                           str(disk)], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120)
    err = " ".join(proc.stderr.split())
    assert "rc=1" in proc.stdout and "DiskFullError: disk full at" in err and "bytes free" in err, err
    assert "SafetensorError" not in err.split("DiskFullError")[-1]
    assert ".tmp" not in proc.stdout  # the half-written checkpoint folder was removed


def test_every_torch_load_in_the_project_is_weights_only() -> None:
    import ast

    unsafe = []
    for folder in ("training", "curator", "bench"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "load"
                        and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"):
                    flag = next((k.value for k in node.keywords if k.arg == "weights_only"), None)
                    if not (isinstance(flag, ast.Constant) and flag.value is True):
                        unsafe.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not unsafe, f"torch.load without weights_only=True: {unsafe}"
