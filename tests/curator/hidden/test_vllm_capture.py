"""The vLLM backend against a local server that plays vLLM's `extract_hidden_states` part on 127.0.0.1."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from curator.cli import main
from curator.engines.vllm_capture import VllmOptions, extract_vllm, load_final_norm
from tests.fakes.vllm_server import FakeVllmServer
from tests.training.capture.test_hidden_states import conversation, write_gen
from training.records.chat_tokens import iter_generation
from training.capture.forward import load_target
from training.capture.hidden_states import extract
from training.capture.prepare import store_meta
from training.storage.reader import HiddenStateStore

ENGINE_LAYERS = [1, 2, 3, 4]  # tiny target: default aux [1, 2, 3] + N=4 for the final state


@pytest.fixture(scope="module")
def target(tiny_target: Path) -> tuple[Any, Any]:
    return load_target(tiny_target, "cpu")


def vllm_args(tiny_target: Path, url: str, gen: Path, out: Path) -> list[str]:
    shared = out.parent / "shared"  # where every test's FakeVllmServer writes
    return ["hidden-states", "--backend", "vllm", "--endpoint", url, "--model", str(tiny_target),
            "--data", str(gen), "--out", str(out), "--concurrency", "3", "--force", "--shared-dir", str(shared)]


def test_both_backends_store_the_same_tensors(tiny_target: Path, tmp_path: Path, target: tuple[Any, Any]) -> None:
    model, tok = target
    gen = write_gen(tmp_path / "gen", [conversation(i) for i in range(10)])
    meta = store_meta(model.config, tok, target=str(tiny_target), layer_ids=None, dtype="bf16", has_final=True)
    extract(model, tok, iter_generation(gen), tmp_path / "hf", meta)
    shared = tmp_path / "shared"
    with FakeVllmServer(tiny_target, shared, ENGINE_LAYERS) as server:
        assert main(vllm_args(tiny_target, server.url, gen, tmp_path / "vllm")) == 0
    hf, vl = HiddenStateStore.open(tmp_path / "hf"), HiddenStateStore.open(tmp_path / "vllm")
    assert sorted(hf.ids()) == sorted(vl.ids()) and len(vl) == 10
    assert vl.meta.aux_layer_ids == hf.meta.aux_layer_ids and vl.meta.tokenizer_sha256 == hf.meta.tokenizer_sha256
    for sid in hf.ids():
        a, b = hf[sid], vl[sid]
        assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.loss_mask, b.loss_mask)
        assert torch.allclose(a.aux.float(), b.aux.float(), rtol=2e-2, atol=2e-2)
        assert torch.allclose(a.final.float(), b.final.float(), rtol=2e-2, atol=3e-2)
    assert not list(shared.iterdir())  # the engine's files are removed once stored
    # the server received exactly the transformers backend's ids, once each
    assert sorted(map(tuple, server.prompts)) == sorted(tuple(hf[s].input_ids.tolist()) for s in hf.ids())


def test_fp8_store_through_vllm(tiny_target: Path, tmp_path: Path) -> None:
    gen = write_gen(tmp_path / "gen", [conversation(i) for i in range(3)])
    with FakeVllmServer(tiny_target, tmp_path / "shared", ENGINE_LAYERS) as server:
        assert main([*vllm_args(tiny_target, server.url, gen, tmp_path / "s"), "--dtype", "fp8"]) == 0
    store = HiddenStateStore.open(tmp_path / "s")
    assert store.meta.dtype == "fp8" and len(store) == 3 and store[store.ids()[0]].aux.dtype == torch.bfloat16


def test_resume_sends_nothing_already_stored(tiny_target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gen = write_gen(tmp_path / "gen", [conversation(i) for i in range(6)])
    with FakeVllmServer(tiny_target, tmp_path / "shared", ENGINE_LAYERS) as server:
        assert main(vllm_args(tiny_target, server.url, gen, tmp_path / "s")) == 0
        first = server.requests
        write_gen(tmp_path / "gen", [conversation(i) for i in range(8)], per_shard=100)
        assert main(vllm_args(tiny_target, server.url, gen, tmp_path / "s")) == 0
        assert server.requests - first == 2
    assert len(HiddenStateStore.open(tmp_path / "s")) == 8


def test_transient_engine_errors_are_retried(tiny_target: Path, tmp_path: Path, target: tuple[Any, Any]) -> None:
    model, tok = target
    gen = write_gen(tmp_path / "gen", [conversation(i) for i in range(4)])
    meta = store_meta(model.config, tok, target="tiny", layer_ids=None, dtype="bf16", has_final=True)
    with FakeVllmServer(tiny_target, tmp_path / "shared", ENGINE_LAYERS, served_name="tiny", flaky=3) as server:
        opts = VllmOptions([server.url], "tiny", str(tmp_path / "shared"), concurrency=2, backoff_s=0.01)
        stats = asyncio.run(extract_vllm(opts, tok, iter_generation(gen), tmp_path / "s", meta,
                                         norm=load_final_norm(tiny_target)))
    assert stats.stored == 4 and stats.failed == 0 and server.requests == 7


@pytest.mark.parametrize(
    ("fault", "fix"),
    [
        ("hidden_dir", "--path-map"),
        ("missing", "--kv-transfer-config"),
        ("truncate", "truncated"),
        ("wrong_layers", "--print-server-command"),
        ("wrong_ids", "same model and tokenizer"),
    ],
)
def test_engine_faults_stop_with_a_one_line_fix_and_store_nothing(
    tiny_target: Path, tmp_path: Path, fault: str, fix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    gen = write_gen(tmp_path / "gen", [conversation(i) for i in range(3)])
    with FakeVllmServer(tiny_target, tmp_path / "shared", ENGINE_LAYERS, fault=fault) as server:
        code = main([*vllm_args(tiny_target, server.url, gen, tmp_path / "s"), "--retries", "1"])
    err = capsys.readouterr().err
    assert code == 1
    line = [ln for ln in err.splitlines() if "error:" in ln]
    assert line and fix in err.replace("\n", " ")
    assert not (tmp_path / "s" / "meta.json").exists() or len(HiddenStateStore.open(tmp_path / "s")) == 0


def test_wrong_served_model_is_named(tiny_target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gen = write_gen(tmp_path / "gen", [conversation(0)])
    with FakeVllmServer(tiny_target, tmp_path / "shared", ENGINE_LAYERS, served_name="other-model") as server:
        assert main(vllm_args(tiny_target, server.url, gen, tmp_path / "s")) == 1
    assert "other-model" in capsys.readouterr().err


def test_print_server_command_names_layers_connector_and_convention(
    tiny_target: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["hidden-states", "--backend", "vllm", "--print-server-command", "--model", str(tiny_target),
                 "--shared-dir", "/mnt/hs"]) == 0
    out = capsys.readouterr()
    cmd = out.out.replace("\n", "")
    assert cmd.startswith("vllm serve") and '"method":"extract_hidden_states"' in cmd
    assert '"eagle_aux_hidden_state_layer_ids":[1,2,3,4]' in cmd
    assert "ExampleHiddenStatesConnector" in cmd and '"shared_storage_path":"/mnt/hs"' in cmd
    assert "--no-enable-chunked-prefill" in cmd
    assert "input of" in out.err and "before the final norm" in out.err.replace("\n", " ")
    assert main(["hidden-states", "--backend", "vllm", "--print-server-command", "--model", str(tiny_target),
                 "--no-final", "--layers", "1,3"]) == 0
    assert '"eagle_aux_hidden_state_layer_ids":[1,3]' in capsys.readouterr().out.replace("\n", "")


def test_slow_engine_writes_are_waited_for_not_requested_again(tiny_target: Path, tmp_path: Path, target: tuple[Any, Any]) -> None:
    model, tok = target
    gen = write_gen(tmp_path / "gen", [conversation(i) for i in range(4)])
    meta = store_meta(model.config, tok, target="tiny", layer_ids=None, dtype="bf16", has_final=True)
    shared = tmp_path / "shared"
    with FakeVllmServer(tiny_target, shared, ENGINE_LAYERS, served_name="tiny", write_delay_s=0.3) as server:
        opts = VllmOptions([server.url + "/v1/"], "tiny", str(shared), concurrency=2, backoff_s=0.01)
        stats = asyncio.run(extract_vllm(opts, tok, iter_generation(gen), tmp_path / "s", meta,
                                         norm=load_final_norm(tiny_target)))
    assert stats.stored == 4 and stats.failed == 0
    assert server.requests == 4  # one request per sample: no half-written file was asked for again
    assert not list(shared.iterdir())  # every file and its .lock removed once read


def test_reader_takes_the_shared_lock_before_reading(tmp_path: Path) -> None:
    import fcntl
    import os

    from safetensors.torch import save

    from curator.engines.vllm_capture import read_engine_file

    path = tmp_path / "cmpl-0.safetensors"
    data = save({"hidden_states": torch.ones(3, 2, 4), "token_ids": torch.arange(3)})
    lock_fd = os.open(f"{path}.lock", os.O_CREAT | os.O_WRONLY, 0o644)
    fcntl.flock(lock_fd, fcntl.LOCK_EX)  # the engine holds the lock while it writes
    path.write_bytes(data[: len(data) // 2])

    async def scenario() -> dict[str, torch.Tensor]:
        reading = asyncio.create_task(read_engine_file(path, lock_wait_s=10, file_wait_s=10))
        await asyncio.sleep(0.3)
        assert not reading.done()  # half a file under an exclusive lock: the reader waits
        path.write_bytes(data)
        os.close(lock_fd)  # the engine's write is done
        return await asyncio.wait_for(reading, 5)

    tensors = asyncio.run(scenario())
    assert torch.equal(tensors["token_ids"], torch.arange(3))
    assert not path.exists() and not Path(f"{path}.lock").exists()


def _victims(root: Path) -> list[Path]:
    """Files a hostile engine may name: a note and a valid safetensors file outside the shared folder."""
    from safetensors.torch import save_file

    (root / "elsewhere").mkdir()
    note, states = root / "notes.txt", root / "elsewhere" / "cmpl-9.safetensors"
    note.write_text("keep me")
    save_file({"hidden_states": torch.zeros(2, 4, 8), "token_ids": torch.arange(2)}, str(states))
    return [note, states]


@pytest.mark.parametrize("named", ["note", "outside", "dotdot", "symlink"])
def test_a_path_the_engine_names_outside_its_shared_folder_is_never_read_or_removed(
    tiny_target: Path, tmp_path: Path, named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    note, states = _victims(tmp_path)
    shared = tmp_path / "shared"

    def report(path: Path) -> str:
        if named == "note":
            return str(note)
        if named == "outside":
            return str(states)
        if named == "dotdot":
            return f"{shared}/../elsewhere/{states.name}"
        link = shared / f"link-{path.name}"  # inside the folder, pointing out of it
        link.symlink_to(states)
        return str(link)

    gen = write_gen(tmp_path / "gen", [conversation(0)])
    with FakeVllmServer(tiny_target, shared, ENGINE_LAYERS, report=report) as server:
        code = main([*vllm_args(tiny_target, server.url, gen, tmp_path / "s"), "--retries", "0"])
    err = " ".join(capsys.readouterr().err.split())
    assert note.read_text() == "keep me" and states.exists()  # nothing outside the folder removed
    assert code == 1 and ("nothing was read or removed" in err or "not read or removed" in err)
    assert "unexpected" not in err


def test_the_stand_in_server_never_joins_a_writer_it_has_not_started(
        tiny_target: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A writer listed before it was started made __exit__ join it first under load ("cannot join
    # thread before it is started"); a slow start makes that order happen every time.
    import threading
    import time

    written: list[bool] = []

    def write() -> None:
        written.append(True)

    real_start = threading.Thread.start

    def slow_start(self: threading.Thread) -> None:
        if getattr(self, "_target", None) is write:
            time.sleep(0.3)
        real_start(self)

    server = FakeVllmServer(tiny_target, tmp_path / "shared", ENGINE_LAYERS).__enter__()
    monkeypatch.setattr(threading.Thread, "start", slow_start)
    starter = threading.Thread(target=server.start_writer, args=(write,))
    real_start(starter)
    time.sleep(0.05)  # the writer is being started
    server.__exit__(None, None, None)
    starter.join()
    assert written == [True]


def test_samples_past_the_targets_positions_are_skipped_not_sent(tiny_target: Path, tmp_path: Path,
                                                                 target: tuple[Any, Any]) -> None:
    model, tok = target
    gen = write_gen(tmp_path / "gen", [conversation(i) for i in range(3)])
    meta = store_meta(model.config, tok, target="tiny", layer_ids=None, dtype="bf16", has_final=True)
    opts = VllmOptions(endpoints=[], model="tiny", shared_dir=str(tmp_path / "shared"), concurrency=2)
    with FakeVllmServer(tiny_target, tmp_path / "shared", ENGINE_LAYERS, served_name="tiny") as server:
        opts.endpoints.append(server.url)
        stats = asyncio.run(extract_vllm(opts, tok, iter_generation(gen), tmp_path / "s", meta,
                                         norm=load_final_norm(tiny_target), positions=4))
        assert server.requests == 0  # nothing past the positions reaches the engine
    assert stats.too_long == 3
