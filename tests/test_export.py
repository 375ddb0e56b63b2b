"""Export: the SGLang and speculators layouts carry the right keys, shapes and layer ids, and load back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from test_trainer import AUX_LAYERS, one_thread, sharp_target, store_dir, tiny_config  # noqa: F401  (fixtures)
from training.errors import TrainingError
from training.export import export_checkpoint, load_draft
from training.checkpoint import load_checkpoint_draft
from training.trainer import train

LAYER = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
         "mlp.up_proj", "mlp.down_proj", "input_layernorm", "hidden_norm", "post_attention_layernorm"]


@pytest.fixture(scope="module")
def run_dir(store_dir: Path, sharp_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("export-run") / "run"
    torch.set_num_threads(1)
    train(tiny_config(store_dir, sharp_target, out, max_steps=2, draft_vocab_size=64, eval_fraction=0.0))
    return out


def shapes(path: Path) -> dict[str, tuple[int, ...]]:
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}


def test_sglang_export_has_the_layout_sglang_loads(run_dir: Path, tmp_path: Path) -> None:
    out = export_checkpoint(run_dir, tmp_path / "sglang", fmt="sglang")
    cfg = json.loads((out / "config.json").read_text())
    got = shapes(out)
    H, V = 64, cfg["vocab_size"]
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["draft_vocab_size"] == 64 and cfg["num_hidden_layers"] == 1 and cfg["hidden_size"] == H
    # SGLang adds 1 to a Llama target's ids (they are layer outputs there): inputs [1, 2, 3] are written [0, 1, 2]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [i - 1 for i in AUX_LAYERS]
    assert cfg["curator"]["aux_layer_inputs"] == AUX_LAYERS
    # vLLM serving this layout reads the top-level key first, as layer inputs
    assert cfg["eagle_aux_hidden_state_layer_ids"] == AUX_LAYERS
    assert set(got) == {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} | {
        f"midlayer.{name}.weight" for name in LAYER}
    assert got["fc.weight"] == (H, 3 * H) and got["lm_head.weight"] == (64, H) and got["d2t"] == (64,)
    assert got["t2d"] == (V,) and got["midlayer.self_attn.q_proj.weight"] == (4 * 16, 2 * H)
    assert not any("embed" in k for k in got)  # the server shares the target's embeddings


def test_speculators_export_renames_the_layer_and_names_the_verifier(run_dir: Path, tmp_path: Path) -> None:
    out = export_checkpoint(run_dir, tmp_path / "spec", fmt="speculators")
    cfg = json.loads((out / "config.json").read_text())
    got = shapes(out)
    assert cfg["architectures"] == ["Eagle3Speculator"] and cfg["speculators_model_type"] == "eagle3"
    assert cfg["transformer_layer_config"]["hidden_size"] == 64 and cfg["draft_vocab_size"] == 64
    assert cfg["eagle_aux_hidden_state_layer_ids"] == AUX_LAYERS
    assert cfg["speculators_config"]["algorithm"] == "eagle3"
    assert cfg["speculators_config"]["verifier"]["architectures"] == ["LlamaForCausalLM"]
    assert {f"layers.0.{name}.weight" for name in LAYER} <= set(got)
    assert not any(k.startswith("midlayer.") for k in got) and {"d2t", "t2d"} <= set(got)
    # speculators' loader leaves a missing embedding uninitialised: the export carries the target's
    assert got["embed_tokens.weight"] == (cfg["transformer_layer_config"]["vocab_size"], 64)


@pytest.mark.parametrize("fmt", ["sglang", "speculators"])
def test_exported_draft_loads_back_and_predicts_the_same(run_dir: Path, sharp_target: Path, tmp_path: Path, fmt: str) -> None:
    trained, _ = load_checkpoint_draft(run_dir)
    loaded = load_draft(export_checkpoint(run_dir, tmp_path / fmt, fmt=fmt), target_dir=sharp_target)
    ids = torch.randint(0, trained.config.vocab_size, (1, 12))
    aux = torch.randn(1, 12, 3 * 64)
    with torch.no_grad():
        a, b = trained(ids, aux).logits, loaded(ids, aux).logits
    assert torch.equal(trained.d2t, loaded.d2t) and torch.equal(trained.t2d, loaded.t2d)
    assert (a - b).abs().max() <= 0.05 * a.abs().max()  # bf16 weights in the export
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() > 0.9


def test_checkpoint_with_incomplete_metadata_is_refused(run_dir: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    ckpt = next((run_dir / "checkpoints").glob("step-*"))
    broken.mkdir()
    for f in ckpt.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    meta = json.loads((broken / "meta.json").read_text())
    del meta["draft_config"]["aux_layer_ids"]
    (broken / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(TrainingError, match="aux_layer_ids"):
        export_checkpoint(broken, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_curator_export_writes_the_chosen_layout(run_dir: Path, tmp_path: Path) -> None:
    from curator.cli import main

    assert main(["export", "--checkpoint", str(run_dir), "--format", "speculators", "--out", str(tmp_path / "d")]) == 0
    assert json.loads((tmp_path / "d" / "config.json").read_text())["architectures"] == ["Eagle3Speculator"]
    assert main(["export", "--checkpoint", str(run_dir), "--format", "eagle", "--out", str(tmp_path / "e")]) == 1


def test_export_never_deletes_a_folder_that_is_not_an_export(run_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(TrainingError, match="holds other files"):
        export_checkpoint(run_dir, run_dir, fmt="sglang")  # the run itself: refused, nothing removed
    assert (run_dir / "checkpoints").is_dir() and (run_dir / "metrics.jsonl").is_file()
    a_file = tmp_path / "notes.txt"
    a_file.write_text("keep me")
    with pytest.raises(TrainingError, match="is a file"):
        export_checkpoint(run_dir, a_file, fmt="sglang")
    assert a_file.read_text() == "keep me"
    out = export_checkpoint(run_dir, tmp_path / "draft", fmt="sglang")
    assert export_checkpoint(run_dir, out, fmt="speculators") == out  # an earlier export is replaced
    assert not list(tmp_path.glob(".*.tmp"))
