"""Engine-fed training against local servers that play vLLM's `extract_hidden_states` part: the draft
learns exactly what it learns from a full store of the same states; faults are survived or stop the
run resumable; the shared folder is left empty."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from curator.cli import main
from curator.hidden.engine_feed import capture_factory, file_request_id
from tests.fakes.vllm_server import FakeVllmServer
from tests.training.capture.test_hidden_states import conversation, write_gen
from tests.training.train.test_trainer import one_thread, sharp_target  # noqa: F401  (fixtures)
from training.feed.engine import EngineFeedError
from training.train.config import TrainConfig
from training.train.trainer import train

ENGINE_LAYERS = [1, 2, 3, 4]  # the tiny target's default aux ids [1, 2, 3] and N=4 for the final state
N_SAMPLES = 40
STEPS = 6


@pytest.fixture(scope="module")
def gen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gen(tmp_path_factory.mktemp("gen") / "gen", [conversation(i) for i in range(N_SAMPLES)])


def config(data: Path, target: Path, out: Path, **kw: Any) -> TrainConfig:
    base = dict(data=str(data), target=str(target), out=str(out), draft_vocab_size=256, ttt_steps=2, lr=3e-3,
                warmup_ratio=0.05, global_batch_size=4, micro_batch_size=2, max_steps=STEPS, log_every=1,
                eval_fraction=0.1, eval_max_samples=4, seed=3)
    return TrainConfig.from_dict({**base, **kw})


def engine_config(gen: Path, target: Path, out: Path, urls: list[str], shared: Path, **kw: Any) -> TrainConfig:
    return config(gen, target, out, engine=",".join(urls), engine_model="tiny", engine_shared_dir=str(shared),
                  engine_retries=1, engine_timeout_s=20.0, prefetch_samples=6, **kw)


def losses(run: Path) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in rows if r["split"] == "train"]


def weights(run: Path) -> dict[str, torch.Tensor]:
    last = sorted((run / "checkpoints").glob("step-*"))[-1]
    return load_file(str(next(last.glob("*.safetensors"))))


def train_engine(cfg: TrainConfig, **kw: Any) -> Any:
    return train(cfg, capture_factory=capture_factory(cfg), **kw)


@pytest.fixture(scope="module")
def store_run(gen: Path, sharp_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference: the same fake engine's states captured into a full store, then trained from it."""
    tmp = tmp_path_factory.mktemp("store_run")
    shared = tmp / "shared"
    with FakeVllmServer(sharp_target, shared, ENGINE_LAYERS, served_name="tiny") as server:
        # one request at a time: the store's index order is the generation order the engine feed reads
        assert main(["hidden-states", "--backend", "vllm", "--endpoint", server.url, "--model", "tiny",
                     "--target-dir", str(sharp_target), "--data", str(gen), "--out", str(tmp / "store"),
                     "--concurrency", "1", "--shared-dir", str(shared), "--force"]) == 0
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(config(tmp / "store", sharp_target, tmp / "run"))
    finally:
        torch.set_num_threads(before)
    return tmp / "run"


def assert_same_training(run: Path, reference: Path) -> None:
    assert losses(run) == losses(reference)  # identical loss curve, step by step
    a, b = weights(run), weights(reference)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k].float(), b[k].float(), rtol=1e-5, atol=1e-6), k


def test_engine_fed_training_equals_training_from_a_full_store(
    gen: Path, sharp_target: Path, store_run: Path, tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    with FakeVllmServer(sharp_target, shared, ENGINE_LAYERS, served_name="tiny") as server:
        result = train_engine(engine_config(gen, sharp_target, tmp_path / "run", [server.url], shared))
    assert_same_training(tmp_path / "run", store_run)
    feed = result.train["feed"]
    # STEPS x 4 training samples captured (and the held-out ones for the final eval), never more than the window ahead
    assert feed["captured"] == STEPS * 4 and feed["window_high_samples"] <= 6 and feed["cache_hits"] == 0
    assert not list(shared.iterdir())  # every engine file and lock removed
    assert all(file_request_id(f"cmpl-{p}-0-0123abcd.safetensors") is None for p in ("x", "curator-zz-1"))


def test_two_engines_one_dies_training_goes_on_the_other(
    gen: Path, sharp_target: Path, store_run: Path, tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    with FakeVllmServer(sharp_target, shared, ENGINE_LAYERS, served_name="tiny") as good, \
            FakeVllmServer(sharp_target, shared, ENGINE_LAYERS, served_name="tiny") as doomed:
        cfg = engine_config(gen, sharp_target, tmp_path / "run", [doomed.url, good.url], shared)

        def kill_at_step_2(record: dict[str, Any]) -> None:
            if record["split"] == "train" and record["step"] == 2:
                doomed.__exit__(None, None, None)  # the server goes away mid-run

        train_engine(cfg, on_metrics=kill_at_step_2)
        assert doomed.requests > 0 and good.requests > 0  # both were kept busy before
    assert_same_training(tmp_path / "run", store_run)
    assert not list(shared.iterdir())


@pytest.mark.parametrize("fault", ["500", "wrong_layers", "truncate", "foreign_name"])
def test_a_faulty_engine_is_taken_out_by_name_and_the_batches_stay_right(
    gen: Path, sharp_target: Path, store_run: Path, tmp_path: Path, fault: str
) -> None:
    shared = tmp_path / "shared"
    kw: dict[str, Any] = {"500": dict(flaky=10**6, flaky_status=500), "wrong_layers": dict(fault="wrong_layers"),
                          "truncate": dict(fault="truncate"),
                          "foreign_name": dict(report=lambda p: str(p.with_name("cmpl-7.safetensors")))}[fault]
    with FakeVllmServer(sharp_target, shared, ENGINE_LAYERS, served_name="tiny", **kw) as bad, \
            FakeVllmServer(sharp_target, shared, ENGINE_LAYERS, served_name="tiny") as good:
        cfg = engine_config(gen, sharp_target, tmp_path / "run", [bad.url, good.url], shared)
        train_engine(cfg)
        assert bad.requests >= 1
    assert_same_training(tmp_path / "run", store_run)
    # a refused engine's files are found by the request names this client sent, and removed
    assert not list(shared.iterdir())


def test_the_only_engine_dies_the_run_stops_resumable_and_resumes_exactly(
    gen: Path, sharp_target: Path, store_run: Path, tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    with FakeVllmServer(sharp_target, shared, ENGINE_LAYERS, served_name="tiny") as server:
        cfg = engine_config(gen, sharp_target, tmp_path / "run", [server.url], shared)

        def die_at_step_3(record: dict[str, Any]) -> None:
            if record["split"] == "train" and record["step"] == 3:
                server.__exit__(None, None, None)

        with pytest.raises(EngineFeedError, match="no engine can capture"):
            train_engine(cfg, on_metrics=die_at_step_3)
    steps = sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("step-*"))
    assert steps and steps[-1] >= "step-0000003"  # every finished step kept
    with FakeVllmServer(sharp_target, shared, ENGINE_LAYERS, served_name="tiny") as server:
        train_engine(engine_config(gen, sharp_target, tmp_path / "run", [server.url], shared), resume=True)
    assert_same_training(tmp_path / "run", store_run)
    assert not list(shared.iterdir())


def test_no_engine_left_is_named_before_anything_trains(gen: Path, sharp_target: Path, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    with FakeVllmServer(sharp_target, shared, ENGINE_LAYERS, served_name="other") as server:
        cfg = engine_config(gen, sharp_target, tmp_path / "run", [server.url], shared)
        with pytest.raises(EngineFeedError, match="'other'.*engine_model"):
            train_engine(cfg)
    assert not (tmp_path / "run" / "checkpoints").exists() or not list((tmp_path / "run" / "checkpoints").iterdir())


def test_the_cache_keeps_samples_for_the_next_epoch_within_its_budget(
    gen: Path, sharp_target: Path, tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    budget = 150_000  # bytes: about a third of the training samples
    with FakeVllmServer(sharp_target, shared, ENGINE_LAYERS, served_name="tiny") as server:
        cfg = engine_config(gen, sharp_target, tmp_path / "run", [server.url], shared, max_steps=None, epochs=2.0,
                            cache_budget=str(budget), eval_max_samples=0)
        result = train_engine(cfg)
        requests = server.requests
    feed = result.train["feed"]
    cache = tmp_path / "run" / "engine-cache" / "rank-0"
    kept = sum(p.stat().st_size for p in cache.iterdir())
    assert 0 < kept <= budget and feed["cache_hits"] > 0
    per_epoch = result.step // 2 * 4
    assert feed["captured"] + feed["cache_hits"] == 2 * per_epoch and requests == feed["captured"]
    with FakeVllmServer(sharp_target, shared, ENGINE_LAYERS, served_name="tiny") as server:
        again = train_engine(engine_config(gen, sharp_target, tmp_path / "every", [server.url], shared,
                                           max_steps=None, epochs=2.0, eval_max_samples=0))
    assert again.train["feed"]["captured"] == 2 * per_epoch  # recapture every epoch
    assert losses(tmp_path / "run") == losses(tmp_path / "every")  # the cache changes nothing learned


def test_python_m_training_trainer_names_the_client_it_lacks(gen: Path, sharp_target: Path, tmp_path: Path) -> None:
    from training.trainer import main as trainer_main

    assert trainer_main([f"data={gen}", f"target={sharp_target}", f"out={tmp_path / 'r'}",
                         "engine=http://127.0.0.1:9"]) == 1


def _wait_for(path_glob: tuple[Path, str], timeout: float, proc: subprocess.Popen[bytes]) -> None:
    root, pattern = path_glob
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if root.exists() and list(root.glob(pattern)):
            return
        if proc.poll() is not None:
            raise AssertionError(f"the trainer exited early: {proc.stdout.read().decode() if proc.stdout else ''}")
        time.sleep(0.05)
    raise AssertionError(f"no {pattern} under {root} within {timeout} s")


def test_sigkill_then_resume_trains_the_same_batches_and_leaves_no_files(
    gen: Path, sharp_target: Path, store_run: Path, tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    out = tmp_path / "run"
    with FakeVllmServer(sharp_target, shared, ENGINE_LAYERS, served_name="tiny", answer_delay_s=0.02) as server:
        cfg = engine_config(gen, sharp_target, out, [server.url], shared, save_every=2, max_steps=12)
        args = [f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in cfg.to_dict().items()
                if v is not None and v != ""]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        proc = subprocess.Popen([sys.executable, "-m", "curator", "train", *args], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, env=env)
        try:
            _wait_for((out / "checkpoints", "step-0000004"), 120, proc)
            time.sleep(0.1)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        assert not (out / "summary.json").exists()
        time.sleep(0.3)  # the engine finishes writing what the dead client asked for
        left = sorted(p.name for p in shared.iterdir())
        assert left and all(file_request_id(n) for n in left)  # the kill left requests' files behind
        # files the client never asked for by name are never read or removed, even ones that look like ours
        decoys = ["cmpl-7.safetensors", "notes.txt", "cmpl-curator-deadbeef-1-0-aaaaaaaa.safetensors"]
        for name in decoys:
            (shared / name).write_bytes(b"not ours")
        train_engine(engine_config(gen, sharp_target, out, [server.url], shared, save_every=2, max_steps=12),
                     resume=True)
    with FakeVllmServer(sharp_target, shared, ENGINE_LAYERS, served_name="tiny") as server:
        train_engine(engine_config(gen, sharp_target, tmp_path / "whole", [server.url], shared, max_steps=12))
    assert losses(out) == losses(tmp_path / "whole")
    # what the killed run left was found by name and removed; the rest is untouched
    assert sorted(p.name for p in shared.iterdir()) == sorted(decoys)
    assert all((shared / n).read_bytes() == b"not ours" for n in decoys)


DDP_TOLERANCE = 1e-4  # as tests/training/train/test_ddp.py: only the order of float sums differs


@pytest.mark.slow
def test_two_ranks_each_draw_their_own_samples_and_reproduce_the_store_run(
    gen: Path, sharp_target: Path, store_run: Path, tmp_path: Path
) -> None:
    from training.train.trainer import train_local_ranks

    shared = tmp_path / "shared"
    with FakeVllmServer(sharp_target, shared, ENGINE_LAYERS, served_name="tiny") as server:
        cfg = engine_config(gen, sharp_target, tmp_path / "run", [server.url], shared, device="cpu")
        train_local_ranks(cfg, 2, threads_per_rank=1, capture_factory=capture_factory(cfg))
        prompts = [tuple(p) for p in server.prompts]
    one, two = losses(store_run), losses(tmp_path / "run")
    assert [s for s, _ in one] == [s for s, _ in two]
    assert all(abs(a - b) <= DDP_TOLERANCE for (_, a), (_, b) in zip(one, two))
    # each training sample of each step was captured once, by the rank that trains it; the held-out ones
    # twice (teacher-forced metrics, then simulated decoding), each by one rank
    meta = json.loads(next(sorted((tmp_path / "run" / "checkpoints").glob("step-*"))[-1].glob("meta.json")).read_text())
    assert len(prompts) == STEPS * 4 + 2 * len(meta["split"]["eval_ids"])
    assert not list(shared.iterdir())


def _torchrun(args: list[str], port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                             "--master-addr", "127.0.0.1", "--master-port", str(port), "-m", "curator", "train",
                             *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True)


@pytest.mark.slow
def test_sigkill_under_ddp_resumes_exactly_and_leaves_no_files(
    gen: Path, sharp_target: Path, tmp_path: Path
) -> None:
    import socket

    shared, out = tmp_path / "shared", tmp_path / "run"
    with FakeVllmServer(sharp_target, shared, ENGINE_LAYERS, served_name="tiny", answer_delay_s=0.02) as server:
        cfg = engine_config(gen, sharp_target, out, [server.url], shared, save_every=2, max_steps=10, device="cpu")
        args = [f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in cfg.to_dict().items()
                if v is not None and v != ""]

        def port() -> int:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                return s.getsockname()[1]

        proc = _torchrun(args, port())
        try:
            _wait_for((out / "checkpoints", "step-0000004"), 240, proc)
            time.sleep(0.1)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)  # every rank at once
            proc.wait()
        assert not (out / "summary.json").exists()
        time.sleep(0.3)
        proc = _torchrun([*args, "--resume"], port())
        assert proc.wait(timeout=300) == 0, proc.stdout.read().decode() if proc.stdout else ""
        whole = engine_config(gen, sharp_target, tmp_path / "whole", [server.url], shared, max_steps=10, device="cpu")
        from training.train.trainer import train_local_ranks

        train_local_ranks(whole, 2, threads_per_rank=1, capture_factory=capture_factory(whole))
    assert losses(out) == losses(tmp_path / "whole")
    assert not list(shared.iterdir())
