"""`curator hidden-states --backend vllm` against a real vLLM's `extract_hidden_states` (CPU build).

The server is started with the flags `curator hidden-states --print-server-command` prints, with one
departure from the engine's code: the connector is `CpuHiddenStatesConnector`
(cpu_hidden_states_connector.py), vLLM's ExampleHiddenStatesConnector with its pinned, CUDA-streamed
copy replaced by a plain one, loaded through vLLM's own connector factory (`kv_connector_module_path`).

The states the client takes from the engine's files (float32: the server runs in float32) equal the
transformers capture of the same ids (relative error under 1e-4) for every aux layer and the final
state, and the two bf16 stores hold the same samples, ids and masks.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any

import pytest
import torch

from vllm_process import VllmServer, start_or_fail

HERE = Path(__file__).parent


def capture_flags(command: str, shared: Path) -> list[str]:
    """The speculative and KV-transfer flags of the printed `vllm serve` command, with the CPU connector."""
    argv = shlex.split(command)
    flags: list[str] = []
    for name in ("--speculative-config", "--kv-transfer-config"):
        flags += [name, argv[argv.index(name) + 1]]
    assert "--no-enable-chunked-prefill" in argv
    kv = json.loads(flags[3])
    assert kv["kv_connector"] == "ExampleHiddenStatesConnector"
    assert kv["kv_connector_extra_config"]["shared_storage_path"] == str(shared)
    kv.update(kv_connector="CpuHiddenStatesConnector", kv_connector_module_path="cpu_hidden_states_connector")
    flags[3] = json.dumps(kv)
    return [*flags, "--no-enable-chunked-prefill"]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def test_engine_states_equal_the_transformers_capture(demo: Path, logs: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from curator.hidden.capture import CaptureSettings, capture_hidden_states
    from curator.cli import main
    from curator.engines.vllm_capture import VllmExtractor, server_command
    from training.capture.forward import load_target
    from training.storage.reader import HiddenStateStore

    hf_store = HiddenStateStore.open(demo / "states")  # the demo's own transformers capture
    layers = list(hf_store.meta.aux_layer_ids)
    gen = tmp_path / "gen"  # a few of the demo's regenerated records
    gen.mkdir()
    lines = [line for shard in sorted((demo / "gen").glob("shard-*.jsonl")) for line in shard.read_text().splitlines()]
    (gen / "shard-00000.jsonl").write_text("\n".join(lines[:6]) + "\n")
    capture_hidden_states(CaptureSettings(model=str(demo / "target"), data=gen, out=tmp_path / "hf",
                                          layer_ids=layers))
    hf = HiddenStateStore.open(tmp_path / "hf")

    shared = tmp_path / "shared"
    printed = server_command("target", hf.meta, str(shared))
    seen: dict[str, tuple[torch.Tensor, torch.Tensor | None]] = {}
    to_sample = VllmExtractor.to_sample

    def spy(self: VllmExtractor, tensors: dict[str, torch.Tensor], s: Any, ids: list[int], path: Path) -> Any:
        sample = to_sample(self, tensors, s, ids, path)
        assert tensors["hidden_states"].dtype == torch.float32  # the server's dtype, before the store rounds it
        seen[s.id] = (sample.aux.clone(), None if sample.final is None else sample.final.clone())
        return sample

    monkeypatch.setattr(VllmExtractor, "to_sample", spy)
    env = {"PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    server = VllmServer(demo / "target", logs, capture_flags(printed, shared), max_num_seqs=2, env=env)
    with start_or_fail(server):
        code = main(["hidden-states", "--backend", "vllm", "--endpoint", server.url, "--model", "target",
                     "--target-dir", str(demo / "target"), "--data", str(gen), "--out", str(tmp_path / "vllm"),
                     "--layers", ",".join(map(str, layers)), "--shared-dir", str(shared), "--concurrency", "2",
                     "--force"])
        assert code == 0, server.log_tail()
    engine = HiddenStateStore.open(tmp_path / "vllm")
    assert sorted(engine.ids()) == sorted(hf.ids()) and len(engine) >= 6
    assert not [p for p in shared.iterdir() if p.suffix == ".safetensors"]  # the engine's files are removed once read

    model, _ = load_target(demo / "target", "cpu")
    model = model.float()
    worst = {"aux": 0.0, "final": 0.0}
    for sid in hf.ids():
        a, b = hf[sid], engine[sid]
        assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.loss_mask, b.loss_mask)
        with torch.no_grad():
            out = model(input_ids=a.input_ids[None].long(), output_hidden_states=True)
        ref_aux = torch.cat([out.hidden_states[i][0] for i in layers], dim=-1)
        ref_final = out.hidden_states[-1][0]  # after the final norm, as the store keeps it
        aux, final = seen[sid]
        h = ref_final.shape[-1]
        for k, layer in enumerate(layers):
            err = rel_err(aux[:, k * h:(k + 1) * h], ref_aux[:, k * h:(k + 1) * h])
            worst["aux"] = max(worst["aux"], err)
            assert err < 1e-4, f"{sid}: layer {layer} differs by {err:.2e}"
        assert final is not None
        worst["final"] = max(worst["final"], rel_err(final, ref_final))
        assert rel_err(final, ref_final) < 1e-4, sid
        # and both bf16 stores hold the same states, up to bf16 rounding of float32 values that differ by ~1e-6
        assert torch.allclose(a.aux.float(), b.aux.float(), rtol=1e-2, atol=1e-2)
    print(f"engine states against the transformers capture, {len(hf)} samples, layers {layers} and the final state: "
          f"largest relative error {worst['aux']:.2e} (aux), {worst['final']:.2e} (final)")
