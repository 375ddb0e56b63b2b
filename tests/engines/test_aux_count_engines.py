"""A draft on 4 aux layers, exported in both layouts, is read with its real count by the engines:
SGLang 0.5.23's own LlamaForCausalLMEagle3 builds a 4-state fc, loads it and computes the toolkit
draft's logits; vLLM 0.33.0's config parser hands its Eagle3 draft `num_aux_hidden_states` = 4 and its
runners the 4 layer ids; speculators 0.9.0 builds a 4-state fc from the ids."""

from __future__ import annotations

import inspect
import json
import re
import shutil
from pathlib import Path

import pytest

pytest.importorskip("sglang", reason="SGLang is not installed: run .ci/engines.sh (tests/engines/requirements.txt)")
pytest.importorskip("vllm", reason="vLLM is not installed: run .ci/engines.sh (tests/engines/requirements.txt)")

import torch  # noqa: E402

from engine_fixtures import run_dir, sharp_target, store_dir  # noqa: E402,F401  (fixtures)
from sglang_cpu import SGLangDraft  # noqa: E402
from tests.training.export.test_export import variant  # noqa: E402
from training.export.export import export_checkpoint  # noqa: E402
from training.eagle3.load import load_draft  # noqa: E402
from training.target.head import load_embeddings  # noqa: E402
from vllm_cpu import parsed_config, runner_layer_ids  # noqa: E402

LAYERS = [1, 2, 3, 4]  # the tiny target's 4 layers: id 4 is its last output, which Gemma-3's loop captures


@pytest.fixture(scope="module")
def four(run_dir: Path, sharp_target: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Return (checkpoint of a draft on 4 aux layers, its target folder, declared a Gemma-3)."""
    root = tmp_path_factory.mktemp("four")
    target = root / "target"
    shutil.copytree(sharp_target, target)
    cfg = json.loads((target / "config.json").read_text())
    cfg["architectures"] = ["Gemma3ForCausalLM"]
    (target / "config.json").write_text(json.dumps(cfg))
    torch.manual_seed(0)
    ckpt = variant(run_dir, root / "ckpt", {"fc.weight": torch.randn(64, 4 * 64) * 0.05},
                   {"aux_layer_ids": LAYERS, "num_aux_layers": 4})
    meta = json.loads((ckpt / "meta.json").read_text())
    meta["target_config"]["architectures"], meta["target_dir"] = ["Gemma3ForCausalLM"], str(target)
    (ckpt / "meta.json").write_text(json.dumps(meta))
    return ckpt, target


def test_sglang_builds_loads_and_runs_a_four_state_fc(four: tuple[Path, Path], tmp_path: Path) -> None:
    ckpt, target = four
    export = export_checkpoint(ckpt, tmp_path / "sg", fmt="sglang")
    sg = SGLangDraft(export, load_embeddings(target))
    assert sg.model.model.fc.weight.shape == (64, 4 * 64)
    ours = load_draft(export, target_dir=target)
    T = 7
    ids = torch.randint(0, ours.config.vocab_size, (T,))
    aux = torch.randn(T, 4 * 64)
    logits, _ = sg.forward(ids, aux, torch.arange(T))
    with torch.no_grad():
        want = ours(ids[None], aux[None]).logits[0]
    assert (logits - want).abs().max() < 1e-4


@pytest.mark.parametrize("fmt", ["sglang", "speculators"])
def test_vllm_reads_four_aux_states_and_four_layer_ids(four: tuple[Path, Path], tmp_path: Path, fmt: str) -> None:
    from vllm.model_executor.models import llama_eagle3

    export = export_checkpoint(four[0], tmp_path / fmt, fmt=fmt)
    cfg = parsed_config(export)
    # vLLM's Eagle3 draft sizes fc from this attribute first (else eagle_config's ids, else 3)
    assert re.search(r'num_aux_hidden_states = getattr\(\s*self\.config, "num_aux_hidden_states", None',
                     inspect.getsource(llama_eagle3))
    assert cfg.num_aux_hidden_states == 4
    assert runner_layer_ids(cfg) == {"v1": tuple(LAYERS), "v2": tuple(LAYERS)}


def test_speculators_builds_a_four_state_fc(four: tuple[Path, Path], tmp_path: Path) -> None:
    from speculators.models.eagle3 import Eagle3DraftModel

    ckpt, target = four
    export = export_checkpoint(ckpt, tmp_path / "spec", fmt="speculators", verifier=str(target))
    model = Eagle3DraftModel.from_pretrained(str(export), torch_dtype=torch.float32)
    assert model.fc.weight.shape == (64, 4 * 64)
    assert model.target_layer_ids == LAYERS
