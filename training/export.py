"""Export a trained draft for serving: SGLang's `LlamaForCausalLMEagle3` layout or vLLM's
speculators `Eagle3Speculator` layout, and load either back.

Both keep the weights in bf16 safetensors without the embedding matrix (the servers share the
target's). SGLang reads `eagle_config.eagle_aux_hidden_state_layer_ids` to know which target
layers to capture; they are written in SGLang's convention (inputs of layers), converted from the
convention the store recorded, so a draft is never served with other layers than it learned from.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from training.draft import DraftConfig, Eagle3Draft
from training.errors import ModelMismatchError, TrainingError
from training.target_head import load_embeddings
from training.trainer import resolve_checkpoint

FORMATS = ("sglang", "speculators")
WEIGHTS_FILE = "model.safetensors"
REQUIRED_META = ("draft_config", "aux_layer_ids", "layer_convention", "target_dir", "step")
REQUIRED_WEIGHTS = ("fc.weight", "midlayer.self_attn.q_proj.weight", "norm.weight", "lm_head.weight", "d2t", "t2d")
# layer conventions a store may record -> offset to SGLang's (aux id = input of that layer)
CONVENTION_OFFSET = {"sglang-input": 0, "output": 1, "specforge-output": 1}


def sglang_layer_ids(aux_layer_ids: list[int], convention: str) -> list[int]:
    """Return the aux layer ids in SGLang's convention (inputs of layers)."""
    if convention not in CONVENTION_OFFSET:
        raise ModelMismatchError(f"unknown layer convention {convention!r}; expected one of {sorted(CONVENTION_OFFSET)}")
    return [int(i) + CONVENTION_OFFSET[convention] for i in aux_layer_ids]


def _read_checkpoint(ckpt: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    try:
        meta = json.loads((ckpt / "meta.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise TrainingError(f"checkpoint {ckpt} has no readable meta.json ({exc}); refusing to export it") from exc
    missing = [k for k in REQUIRED_META if meta.get(k) in (None, "", [])]
    if missing:
        raise TrainingError(f"checkpoint {ckpt} metadata lacks {missing}; refusing to export a draft that cannot be served right")
    weights = read_weights(ckpt / "draft.safetensors")
    absent = [k for k in REQUIRED_WEIGHTS if k not in weights]
    if absent:
        raise TrainingError(f"checkpoint {ckpt} lacks weights {absent}; refusing to export it")
    return meta, weights


def _llama_fields(cfg: DraftConfig) -> dict[str, Any]:
    """Return the Llama-config fields that describe the draft's decoder layer."""
    return {
        "model_type": "llama",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": cfg.rope_scaling,
        "max_position_embeddings": cfg.max_position_embeddings,
        "vocab_size": cfg.vocab_size,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "bfloat16",
    }


def _serving_weights(weights: dict[str, torch.Tensor], fmt: str) -> dict[str, torch.Tensor]:
    """Return the weights renamed for `fmt`, floats in bf16, without embeddings."""
    out = {}
    for name, t in weights.items():
        if name == "embed_tokens.weight":
            continue
        if fmt == "speculators" and name.startswith("midlayer."):
            name = "layers.0." + name[len("midlayer.") :]
        out[name] = (t.to(torch.bfloat16) if t.is_floating_point() else t).contiguous()
    return out


def export_checkpoint(ckpt_dir: str | Path, out_dir: str | Path, fmt: str = "sglang") -> Path:
    """Write the checkpoint (or a run's latest) as a servable draft in `fmt`; return `out_dir`."""
    if fmt not in FORMATS:
        raise TrainingError(f"unknown export format {fmt!r}; choose one of {FORMATS}")
    ckpt = resolve_checkpoint(ckpt_dir)
    meta, weights = _read_checkpoint(ckpt)
    cfg = DraftConfig.from_dict(meta["draft_config"])
    layer_ids = sglang_layer_ids(meta["aux_layer_ids"], meta["layer_convention"])
    target_cfg = meta.get("target_config") or {}
    provenance = {"checkpoint": str(ckpt.resolve()), "step": meta["step"], "target_dir": meta["target_dir"],
                  "vocab": meta.get("vocab", {}), "ttt_steps": meta.get("ttt_steps")}
    if fmt == "sglang":
        config: dict[str, Any] = {
            "architectures": ["LlamaForCausalLMEagle3"],
            **_llama_fields(cfg),
            "draft_vocab_size": cfg.draft_vocab_size,
            "target_hidden_size": cfg.target_hidden_size,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": layer_ids, "use_aux_hidden_state": True},
            "curator": provenance,
        }
    else:
        config = {
            "architectures": ["Eagle3Speculator"],
            "speculators_model_type": "eagle3",
            "transformer_layer_config": {"architectures": ["LlamaForCausalLM"], **_llama_fields(cfg)},
            "draft_vocab_size": cfg.draft_vocab_size,
            "target_hidden_size": cfg.target_hidden_size,
            "norm_before_residual": False,
            "eagle_aux_hidden_state_layer_ids": layer_ids,
            "speculators_config": {
                "algorithm": "eagle3",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": min(3, int(meta.get("ttt_steps") or 3))}],
                "default_proposal_method": "greedy",
                "verifier": {
                    "name_or_path": target_cfg.get("_name_or_path") or meta["target_dir"],
                    "architectures": target_cfg.get("architectures") or [],
                },
            },
            "torch_dtype": "bfloat16",
            "curator": provenance,
        }
    out = Path(out_dir).resolve()
    _check_replaceable(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex[:6]}.tmp")
    tmp.mkdir()
    try:
        save_file(_serving_weights(weights, fmt), str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)  # an earlier export only (_check_replaceable)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _check_replaceable(out: Path) -> None:
    """Refuse an --out that is a file or a folder holding anything but an earlier export."""
    if not out.exists():
        return
    if not out.is_dir():
        raise TrainingError(f"--out {out} is a file; export into a new or empty directory")
    others = sorted(p.name for p in out.iterdir() if p.name not in {"config.json", WEIGHTS_FILE})
    if others:
        raise TrainingError(
            f"--out {out} holds other files ({', '.join(others[:5])}{', ...' if len(others) > 5 else ''}); "
            "export into a new or empty directory (only an earlier export is replaced)"
        )


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """Return the tensors of a safetensors file; a missing or damaged file is a TrainingError."""
    try:
        return load_file(str(path))
    except (OSError, SafetensorError) as exc:
        raise TrainingError(f"{path} is not a readable safetensors file ({exc}); was it copied completely?") from exc


def _config_from_export(config: dict[str, Any]) -> tuple[DraftConfig, str]:
    """Return (draft config, format) read from an exported config.json."""
    arch = (config.get("architectures") or [""])[0]
    if arch == "LlamaForCausalLMEagle3":
        layer, fmt, layer_ids = config, "sglang", config.get("eagle_config", {}).get("eagle_aux_hidden_state_layer_ids", [])
    elif arch == "Eagle3Speculator":
        layer, fmt, layer_ids = config["transformer_layer_config"], "speculators", config.get("eagle_aux_hidden_state_layer_ids", [])
    else:
        raise ModelMismatchError(f"config.json architecture {arch!r} is not an EAGLE-3 draft this toolkit exports")
    cfg = DraftConfig(
        hidden_size=int(layer["hidden_size"]),
        target_hidden_size=int(config.get("target_hidden_size") or layer["hidden_size"]),
        num_attention_heads=int(layer["num_attention_heads"]),
        num_key_value_heads=int(layer["num_key_value_heads"]),
        head_dim=layer.get("head_dim"),
        intermediate_size=int(layer["intermediate_size"]),
        vocab_size=int(layer["vocab_size"]),
        draft_vocab_size=int(config["draft_vocab_size"]),
        num_aux_layers=len(layer_ids) or 3,
        rms_norm_eps=float(layer.get("rms_norm_eps", 1e-5)),
        rope_theta=float(layer.get("rope_theta", 10000.0)),
        rope_scaling=layer.get("rope_scaling"),
        max_position_embeddings=int(layer.get("max_position_embeddings", 8192)),
        aux_layer_ids=[int(i) for i in layer_ids],
    )
    return cfg, fmt


def load_draft(export_dir: str | Path, target_dir: str | Path | None = None) -> Eagle3Draft:
    """Return the draft in an export directory (either layout), float32, in eval mode.

    Embeddings come from the export when it has them, else from `target_dir` (or the target
    recorded at export time when that directory still exists).
    """
    root = Path(export_dir)
    try:
        config = json.loads((root / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise TrainingError(f"{root} is not an exported draft (config.json unreadable: {exc})") from exc
    if not isinstance(config, dict):
        raise TrainingError(f"{root}/config.json is not a JSON object; re-export the draft with curator export")
    try:
        cfg, fmt = _config_from_export(config)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ModelMismatchError(f"{root}/config.json lacks or garbles a field the draft needs ({exc!r}); "
                                 "re-export the draft with curator export") from exc
    weights = read_weights(root / WEIGHTS_FILE)
    if fmt == "speculators":
        weights = {("midlayer." + k[len("layers.0."):] if k.startswith("layers.0.") else k): v for k, v in weights.items()}
    draft = Eagle3Draft(cfg)
    weights = {k: (v.float() if v.is_floating_point() else v) for k, v in weights.items()}
    missing, unexpected = draft.load_state_dict(weights, strict=False)
    if unexpected or set(missing) - {"embed_tokens.weight"}:
        raise ModelMismatchError(f"{root} weights do not fit its config (missing {missing}, unexpected {unexpected})")
    if "embed_tokens.weight" in missing:
        target = target_dir or (config.get("curator") or {}).get("target_dir")
        if not target or not Path(target).exists():
            raise TrainingError(f"{root} has no embeddings; pass the target's model directory to load them from")
        draft.load_embeddings(load_embeddings(target))
    return draft.eval()
