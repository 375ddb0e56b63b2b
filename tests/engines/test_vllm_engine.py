"""vLLM 0.33.0 reads both export layouts as trained: its speculators config parser, its model
runners' layer-id readers and its load_weights decisions (on a skeleton with vLLM's names)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: run .ci/engines.sh (tests/engines/requirements.txt)")

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from engine_fixtures import full_vocab_run, run_dir, sharp_target, store_dir  # noqa: E402,F401  (fixtures)
from training.export.export import export_checkpoint  # noqa: E402
from training.eagle3.load import load_draft  # noqa: E402
from vllm_cpu import DraftSkeleton, parsed_config, runner_layer_ids  # noqa: E402

TARGET_H = 64


def target_vocab(target: Path) -> int:
    return int(json.loads((target / "config.json").read_text())["vocab_size"])


def load_into_skeleton(export: Path, target: Path) -> DraftSkeleton:
    cfg = parsed_config(export).to_dict()
    skeleton = DraftSkeleton(cfg, TARGET_H, target_vocab(target))
    skeleton.load_weights(iter(load_file(str(export / "model.safetensors")).items()))
    return skeleton


def test_vllm_parses_the_speculators_export_and_feeds_the_trained_layers(run_dir: Path, tmp_path: Path) -> None:
    export = export_checkpoint(run_dir, tmp_path / "spec", fmt="speculators")
    trained = json.loads((export / "config.json").read_text())["curator"]["aux_layer_inputs"]
    cfg = parsed_config(export)
    assert cfg.architectures == ["Eagle3LlamaForCausalLM"] and cfg.draft_vocab_size == 64
    assert runner_layer_ids(cfg) == {"v1": tuple(trained), "v2": tuple(trained)}


def test_vllm_feeds_an_sglang_layout_export_the_trained_layers(run_dir: Path, tmp_path: Path) -> None:
    # the SGLang numbering under eagle_config is one off for a Llama target; vLLM must not read it
    export = export_checkpoint(run_dir, tmp_path / "sg", fmt="sglang")
    config = json.loads((export / "config.json").read_text())
    assert runner_layer_ids(parsed_config(export)) == {"v1": tuple(config["curator"]["aux_layer_inputs"]),
                                                      "v2": tuple(config["curator"]["aux_layer_inputs"])}


def test_vllm_loads_every_weight_of_a_small_vocab_speculators_export(run_dir: Path, sharp_target: Path,
                                                                     tmp_path: Path) -> None:
    export = export_checkpoint(run_dir, tmp_path / "spec", fmt="speculators")
    skeleton = load_into_skeleton(export, sharp_target)
    ours = load_draft(export, target_dir=sharp_target)
    for name, param in skeleton.named_parameters():
        assert torch.isfinite(param.float()).all(), f"{name} was never loaded"
    params = dict(skeleton.named_parameters())
    assert torch.equal(params["draft_id_to_target_id"], ours.d2t)
    assert torch.allclose(params["model.embed_tokens.weight"], ours.embed_tokens.weight, atol=1e-2)
    attn = ours.midlayer.self_attn
    packed = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
    assert torch.equal(params["model.layers.0.self_attn.qkv_proj.weight"], packed.to(torch.bfloat16).float())


def test_an_equal_vocab_export_has_no_d2t_because_vllm_has_nowhere_to_put_it(full_vocab_run: Path, sharp_target: Path,
                                                                             tmp_path: Path) -> None:
    export = export_checkpoint(full_vocab_run, tmp_path / "full", fmt="speculators")
    weights = load_file(str(export / "model.safetensors"))
    assert "d2t" not in weights and "t2d" not in weights
    skeleton = load_into_skeleton(export, sharp_target)
    assert skeleton.draft_id_to_target_id is None
    assert all(torch.isfinite(p.float()).all() for p in skeleton.parameters())
    # what a d2t in such a file does to vLLM: its loader finds no parameter for it
    weights["d2t"] = torch.zeros(target_vocab(sharp_target), dtype=torch.long)
    fresh = DraftSkeleton(parsed_config(export).to_dict(), TARGET_H, target_vocab(sharp_target))
    with pytest.raises((KeyError, ValueError), match="draft_id_to_target_id"):
        fresh.load_weights(iter(weights.items()))


@pytest.mark.parametrize("user_config", [None, {"num_speculative_tokens": 5}, {"method": "eagle", "model": "/elsewhere"}],
                         ids=["bare", "own-tokens", "locked-fields"])
def test_doctor_resolves_vllm_serve_export_as_vllm_does(run_dir: Path, tmp_path: Path, user_config: dict | None) -> None:
    # `vllm serve EXPORT [--speculative-config ...]`: vLLM's own resolution against the doctor's
    import shlex

    from vllm.transformers_utils.config import maybe_override_with_speculators

    from curator.doctor import check_launch, diagnose, parse_launch, read_draft

    export = export_checkpoint(run_dir, tmp_path / "spec", fmt="speculators", verifier="org/target")
    model, tokenizer, resolved = maybe_override_with_speculators(
        model=str(export), tokenizer=None, trust_remote_code=False, vllm_speculative_config=user_config)
    command = f"vllm serve {export} --port 8000" + (f" -sc {shlex.quote(json.dumps(user_config))}" if user_config else "")
    spec = parse_launch(command)
    checks = {c.name: c for c in check_launch(spec, read_draft(export))}
    assert (model, tokenizer) == ("org/target", "org/target") and spec.target == model
    assert spec.algorithm == resolved["method"] == "eagle3" and spec.draft_path == resolved["model"] == str(export)
    assert spec.steps == resolved["num_speculative_tokens"]
    assert checks["launch form"].status == "ok" and checks["algorithm"].status == "ok"
    assert (checks.get("speculative config") is not None) == ("method" in (user_config or {}))
    assert diagnose(export, launch=command).ok
