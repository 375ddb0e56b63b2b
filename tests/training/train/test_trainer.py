"""The trainer: a draft trained on a tiny target's states learns, and an interrupted run resumes exactly."""

from __future__ import annotations

import json
import math
import random
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer, LlamaForCausalLM

from tests.conftest import toy_corpus
from training.errors import ModelMismatchError, TrainingError
from training.storage.format import HiddenStateSample, StoreMeta
from training.storage.reader import HiddenStateStore
from training.storage.writer import StoreWriter
from training.target.head import TargetHead
from training.target.toy import build_target
from training.train.config import TrainConfig
from training.feed.batches import epoch_batches, load_batch, split_eval
from training.train.checkpoint import load_checkpoint_draft
from training.eagle3.objective import offline_metrics, target_signals
from training.train.trainer import lr_lambda, train

AUX_LAYERS = [1, 2, 3]


@torch.no_grad()
def make_store(target_dir: Path, out: Path, n: int = 48, seed: int = 0) -> Path:
    """Capture the tiny target's states on `n` chat samples into a store at `out`; return it."""
    tok = AutoTokenizer.from_pretrained(target_dir)
    model = LlamaForCausalLM.from_pretrained(target_dir).eval()
    cfg = model.config
    texts = toy_corpus(2 * n, seed=seed)
    rng = random.Random(seed)
    meta = StoreMeta(target=str(target_dir), hidden_size=cfg.hidden_size, num_layers=cfg.num_hidden_layers,
                     vocab_size=cfg.vocab_size, aux_layer_ids=AUX_LAYERS)
    with StoreWriter(out, meta) as writer:
        for i in range(n):
            prompt = [{"role": "user", "content": texts[2 * i]}]
            answer = {"role": "assistant", "content": texts[2 * i + 1] + " " + rng.choice(texts)}
            head = tok.apply_chat_template(prompt, tokenize=True, add_generation_prompt=True, return_dict=False)
            ids = tok.apply_chat_template([*prompt, answer], tokenize=True, return_dict=False)
            input_ids = torch.tensor(ids)
            hs = model(input_ids[None], output_hidden_states=True).hidden_states
            mask = torch.zeros(len(ids), dtype=torch.bool)
            mask[len(head):] = True
            writer.add(HiddenStateSample(
                id=f"s{i:04d}", input_ids=input_ids, loss_mask=mask,
                aux=torch.cat([hs[layer][0] for layer in AUX_LAYERS], -1).to(torch.bfloat16),
                final=hs[-1][0].to(torch.bfloat16), category="chat"))
    return out


@pytest.fixture(scope="session")
def sharp_target(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny target with its lm_head scaled up: random weights, but confident, varied predictions."""
    out = tmp_path_factory.mktemp("sharp_target")
    shutil.copytree(tiny_target, out, dirs_exist_ok=True)
    weights = load_file(str(out / "model.safetensors"))
    weights["lm_head.weight"] = weights["lm_head.weight"] * 40
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


@pytest.fixture(scope="session")
def store_dir(sharp_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_store(sharp_target, tmp_path_factory.mktemp("store"), n=48)


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Tiny matmuls run far faster on one thread than contended across cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_config(store: Path, target: Path, out: Path, **kw: object) -> TrainConfig:
    base = dict(data=str(store), target=str(target), out=str(out), draft_vocab_size=512, ttt_steps=3, lr=3e-3,
                warmup_ratio=0.05, global_batch_size=8, micro_batch_size=4, max_steps=60, log_every=10,
                eval_fraction=0.1)
    return TrainConfig.from_dict({**base, **kw})


def read_metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_draft_learns_to_predict_the_target(store_dir: Path, sharp_target: Path, tmp_path: Path) -> None:
    store = HiddenStateStore.open(store_dir)
    train_ids, _ = split_eval(store.ids(), 0.1)
    head = TargetHead.from_pretrained(sharp_target)
    # the best constant guess: the target's most frequent token on the loss positions
    batch = load_batch(store, train_ids, 4096)
    sig = target_signals(batch, head, torch.arange(head.vocab_size), torch.ones(head.vocab_size, dtype=torch.bool))
    majority = torch.bincount(sig.argmax[sig.valid]).max().item() / sig.valid.sum().item()

    result = train(tiny_config(store_dir, sharp_target, tmp_path / "run", max_steps=80))
    draft, meta = load_checkpoint_draft(result.checkpoint)
    after = offline_metrics(draft, store, train_ids, 3, head)
    log = [r for r in read_metrics(tmp_path / "run") if r["split"] == "train"]

    assert after["acc"][0] > max(0.3, 2.5 * majority)
    assert log[-1]["acc"][0] > 2 * log[0]["acc"][0] and log[-1]["loss"] < log[0]["loss"]
    assert 1.0 < after["accept_length"] <= 4.0 and len(after["cond_acc"]) == 3
    assert meta["draft_config"]["aux_layer_ids"] == AUX_LAYERS and (tmp_path / "run" / "vocab.json").exists()
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["step"] == 80
    last_eval = [r for r in read_metrics(tmp_path / "run") if r["split"] == "eval"][-1]
    # decoding simulated on the held-out split, logged beside the teacher-forced figure
    assert 1.0 <= last_eval["sim_accept_length"] <= 4.0 and len(last_eval["sim_per_position"]) == 3
    assert last_eval["sim_categories"]


def test_resume_after_interruption_matches_an_uninterrupted_run(store_dir: Path, sharp_target: Path, tmp_path: Path) -> None:
    kw = dict(max_steps=8, log_every=2, save_every=3, eval_fraction=0.1)
    whole = train(tiny_config(store_dir, sharp_target, tmp_path / "whole", **kw))
    cut = tiny_config(store_dir, sharp_target, tmp_path / "cut", **kw)
    first = train(cut, stop_after_steps=4)  # the session ends mid-run, between checkpoints
    assert first.step == 4
    with pytest.raises(TrainingError, match="--resume"):
        train(cut)
    resumed = train(cut, resume=True)
    assert resumed.step == 8
    a = load_file(str(whole.checkpoint / "draft.safetensors"))
    b = load_file(str(resumed.checkpoint / "draft.safetensors"))
    assert a.keys() == b.keys()
    assert max((a[k].float() - b[k].float()).abs().max().item() for k in a) <= 1e-6
    losses = lambda run: [(r["step"], r["loss"]) for r in read_metrics(run) if r["split"] == "train"]
    whole_losses, cut_losses = losses(tmp_path / "whole"), losses(tmp_path / "cut")
    assert [s for s, _ in whole_losses] == [s for s, _ in cut_losses] == [2, 4, 6, 8]
    assert all(abs(x - y) <= 1e-6 for (_, x), (_, y) in zip(whole_losses, cut_losses))


def test_resume_with_a_changed_config_is_refused(store_dir: Path, sharp_target: Path, tmp_path: Path) -> None:
    cfg = tiny_config(store_dir, sharp_target, tmp_path / "run", max_steps=2)
    train(cfg)
    with pytest.raises(TrainingError, match="lr"):
        train(cfg.replace(lr=1.0), resume=True)


def test_a_checkpoints_link_planted_in_out_is_refused_and_nothing_lands_outside(
    store_dir: Path, sharp_target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`train out=run` with run/checkpoints a link once saved step-* and latest.json outside (sweep 2026-12-04 item 3)."""
    from curator.cli import main

    outside = tmp_path / "outside"
    (outside / ".step-0000001.abc123.tmp").mkdir(parents=True)  # theirs: the sweep of half-saves would delete it
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoints").symlink_to(outside, target_is_directory=True)
    config = tmp_path / "run.json"
    config.write_text(json.dumps({"data": str(store_dir), "target": str(sharp_target), "ttt_steps": 2,
                                  "global_batch_size": 4, "micro_batch_size": 4, "draft_vocab_size": 128}))
    assert main(["train", "--config", str(config), f"out={run}", "max_steps=1"]) == 1
    assert "checkpoints is a link" in capsys.readouterr().err
    assert [p.name for p in outside.iterdir()] == [".step-0000001.abc123.tmp"]
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints"]  # nothing written before the refusal


def test_a_metrics_link_planted_before_a_resume_is_refused_and_never_appended_through(
    store_dir: Path, sharp_target: Path, tmp_path: Path
) -> None:
    from training.io.atomic import OutputPathError

    cfg = tiny_config(store_dir, sharp_target, tmp_path / "run", max_steps=4, log_every=1, save_every=2)
    train(cfg, stop_after_steps=2)
    outside = tmp_path / "outside.jsonl"
    outside.write_text("theirs\n")
    (tmp_path / "run" / "metrics.jsonl").unlink()
    (tmp_path / "run" / "metrics.jsonl").symlink_to(outside)
    with pytest.raises(OutputPathError, match="metrics.jsonl is a link"):
        train(cfg, resume=True)
    assert outside.read_text() == "theirs\n"


def test_store_from_another_target_is_refused(store_dir: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    build_target(toy_corpus(60, seed=3), other, vocab_size=300, seed=1, hidden_size=32, num_layers=2)
    with pytest.raises(ModelMismatchError, match="hidden size"):
        train(tiny_config(store_dir, other, tmp_path / "run"))


def test_lr_schedule_warms_up_then_decays_to_the_floor() -> None:
    f = lr_lambda(100, 0.1, 0.1)
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0)
    assert f(50) < f(10) and f(99) == pytest.approx(0.1, abs=0.01)


def test_batches_are_length_bucketed_and_reproducible() -> None:
    ids = [f"s{i}" for i in range(64)]
    lengths = {s: (i * 37) % 100 for i, s in enumerate(ids)}
    a = epoch_batches(ids, lengths, 8, 4, seed=1, epoch=0)
    assert a == epoch_batches(ids, lengths, 8, 4, seed=1, epoch=0) != epoch_batches(ids, lengths, 8, 4, seed=1, epoch=1)
    assert sorted(s for b in a for s in b) == sorted(ids)
    spread = sum(max(lengths[s] for s in b) - min(lengths[s] for s in b) for b in a) / len(a)
    assert spread < 40  # random batches of 8 from 0..99 would span ~75


def test_curator_train_takes_options_from_the_file_and_flags_override(
    store_dir: Path, sharp_target: Path, tmp_path: Path
) -> None:
    from curator.cli import main

    config = tmp_path / "run.yaml"
    config.write_text(f"data: {store_dir}\ntarget: {sharp_target}\nttt_steps: 2\nmax_steps: 50\n"
                      "global_batch_size: 4\nmicro_batch_size: 4\ndraft_vocab_size: 128\nlog_every: 1\n")
    code = main(["train", "--config", str(config), f"out={tmp_path / 'run'}", "max_steps=2",
                 "--catalog", str(tmp_path / "catalog.duckdb")])
    assert code == 0
    log = read_metrics(tmp_path / "run")
    assert [r["step"] for r in log if r["split"] == "train"] == [1, 2] and len(log[0]["acc"]) == 2
    assert json.loads((tmp_path / "run" / "vocab.json").read_text())["draft_vocab_size"] == 128
    from curator.catalog import Catalog

    _, rows = Catalog.open(tmp_path / "catalog.duckdb").query("SELECT count(*) FROM training_runs", [])
    assert rows[0][0] == 1
    saved = json.loads((tmp_path / "run" / "train_config.json").read_text())
    assert saved["max_steps"] == 2 and saved["ttt_steps"] == 2  # the run keeps what it was told
    assert main(["train", "--config", str(config), f"out={tmp_path / 'run'}", "ttt_steps=0"]) == 1
    assert main(["train", "--config", str(config), "no_such_option=1"]) == 1


def test_the_bare_trainer_entry_point_reads_the_same_arguments(
    store_dir: Path, sharp_target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from training.train.trainer import main as trainer_main

    config = tmp_path / "run.json"
    config.write_text(json.dumps({"data": str(store_dir), "target": str(sharp_target), "ttt_steps": 2,
                                  "global_batch_size": 4, "micro_batch_size": 4, "draft_vocab_size": 128}))
    assert trainer_main(["--config", str(config), f"out={tmp_path / 'run'}", "max_steps=1"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["step"] == 1
    assert trainer_main(["--config", str(config), "max_steps=1"]) == 1  # out missing: one line, exit 1


def test_gpu_bench_logic_runs_at_tiny_size_on_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_gpu", Path(__file__).parents[3] / "bench" / "train_gpu.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--hidden", "32", "--heads", "4", "--kv-heads", "2", "--intermediate", "64", "--vocab", "300",
                       "--draft-vocab", "100", "--ttt-steps", "3", "--seq", "32", "--batch", "2", "--steps", "2",
                       "--warmup", "1", "--device", "cpu", "--peak-n", "64", "--peak-iters", "2"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["tokens_per_s"] > 0 and 0 < result["fraction_of_peak"] and result["ttt_steps"] == 3
    assert math.isfinite(result["last_loss"])


def test_held_out_store_and_nested_pools(store_dir: Path, sharp_target: Path, tmp_path: Path) -> None:
    held = make_store(sharp_target, tmp_path / "held", n=6, seed=7)
    run = tmp_path / "run"
    cfg = tiny_config(store_dir, sharp_target, run, eval_data=str(held), max_train_samples=16, max_steps=2)
    train(cfg)
    evals = [m for m in read_metrics(run) if m["split"] == "eval"]
    assert evals and evals[-1]["samples"] == 6  # every held-out sample, none of the training store's
    [ckpt] = [d for d in (run / "checkpoints").iterdir() if d.is_dir()]
    meta = json.loads((ckpt / "meta.json").read_text())
    assert meta["train_config"]["max_train_samples"] == 16

    other = tmp_path / "other"
    shutil.copytree(held, other)
    (other / "meta.json").write_text(json.dumps({**json.loads((other / "meta.json").read_text()), "aux_layer_ids": [0, 1, 2]}))
    with pytest.raises(TrainingError, match="captured differently"):
        train(tiny_config(store_dir, sharp_target, tmp_path / "run2", eval_data=str(other), max_steps=1))


def test_fresh_run_in_a_killed_runs_folder_rebuilds_its_vocab(store_dir: Path, sharp_target: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    # What a run killed before its first checkpoint leaves: a vocab of another size, old metrics.
    (run / "metrics.jsonl").write_text(json.dumps({"split": "train", "step": 50, "loss": 9.0}) + "\n")
    (run / "vocab.json").write_text(json.dumps({"draft_ids": list(range(7)), "target_vocab_size": 10}))
    train(tiny_config(store_dir, sharp_target, run, draft_vocab_size=64, max_steps=2))
    vocab = json.loads((run / "vocab.json").read_text())
    assert len(vocab["draft_ids"]) == 64
    assert [m["step"] for m in read_metrics(run)][0] != 50


def test_prefetcher_returns_each_step_in_order_and_reads_ahead() -> None:
    import threading

    from training.feed.batches import Prefetcher

    calls: list[int] = []
    lock = threading.Lock()

    def load(step: int) -> list:
        with lock:
            calls.append(step)
        return [step * 10]

    p = Prefetcher(load, total_steps=5, depth=2)
    try:
        assert [p.get(s) for s in range(5)] == [[0], [10], [20], [30], [40]]
    finally:
        p.close()
    assert sorted(calls) == [0, 1, 2, 3, 4]  # each step read exactly once, ahead of its turn
    resumed = Prefetcher(load, total_steps=5, depth=0)
    assert resumed.get(3) == [30]


def test_logged_loss_splits_into_the_targets_entropy_and_the_kl_the_draft_can_remove(
    store_dir: Path, sharp_target: Path, tmp_path: Path
) -> None:
    train(tiny_config(store_dir, sharp_target, tmp_path / "run", max_steps=30, log_every=10))
    log = [r for r in read_metrics(tmp_path / "run") if r["split"] == "train"]
    for r in log:
        assert r["target_entropy"] > 0 and abs(r["loss"] - r["target_entropy"] - r["kl"]) < 1e-9
        assert r["kl"] >= -1e-6  # cross-entropy never falls below the entropy of the same distribution
    assert log[-1]["kl"] < log[0]["kl"]


def test_summary_records_the_checkpoint_absolute_when_out_is_relative(
        store_dir: Path, sharp_target: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `curator forecast --run /abs/run` reads summary.json from another cwd: a cwd-relative path would not be found
    (tmp_path / "a").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    train(tiny_config(store_dir, sharp_target, Path("relrun"), max_steps=2, log_every=1, eval_fraction=0.0))
    monkeypatch.chdir(tmp_path)
    ckpt = Path(json.loads((tmp_path / "a" / "relrun" / "summary.json").read_text())["checkpoint"])
    assert ckpt.is_absolute() and ckpt == tmp_path / "a" / "relrun" / "checkpoints" / "step-0000002" and ckpt.is_dir()
