"""Export a trained draft for serving: SGLang's `LlamaForCausalLMEagle3` layout or vLLM's
speculators `Eagle3Speculator` layout, and load either back.

Each layout is written as its reader reads it (checked against SGLang 0.5.23, vLLM 0.33.0 and
speculators 0.9.0):
- the aux layer ids go into the config in the numbering that engine applies for the target's
  class (training.layers); in the SGLang layout they are left out when they equal SGLang's own
  default, and an export SGLang cannot be told to serve right is refused;
- `d2t`/`t2d` are left out when the draft vocabulary is the target's (vLLM only creates its
  `draft_id_to_target_id` when the sizes differ, and fails on a file that has one anyway);
- the speculators layout carries `embed_tokens.weight` (speculators' own checkpoints do, and its
  loader leaves a missing one uninitialised under transformers 5); the SGLang layout does not
  (SGLang shares the target's);
- the SGLang layout also carries the ids, as layer inputs, at the top level of its config, the key
  vLLM's model runners read first, so vLLM serving that layout feeds the trained layers too;
- `speculators_config.verifier.name_or_path` is the target's Hub id, which vLLM resolves.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from training.checkpoint import layer_ids as checkpoint_layer_ids
from training.checkpoint import read_checkpoint, read_weights
from training.draft import DraftConfig, Eagle3Draft
from training.errors import ModelMismatchError, TrainingError
from training.layers import sglang_captured, sglang_config_ids, sglang_rule, vllm_captured
from training.target_config import read_target_config
from training.target_head import load_embeddings

FORMATS = ("sglang", "speculators")
WEIGHTS_FILE = "model.safetensors"


def _target_shape(meta: dict[str, Any]) -> tuple[str | None, int]:
    """Return (target class, layer count) recorded in the checkpoint, else read from the target."""
    cfg = meta.get("target_config") or {}
    if not cfg.get("num_hidden_layers") and Path(str(meta.get("target_dir", ""))).exists():
        cfg = read_target_config(meta["target_dir"])
    if not cfg.get("num_hidden_layers"):
        raise TrainingError("the checkpoint records no target layer count and its target_dir is gone; "
                            "the layer ids cannot be written for the engine")
    arch = (cfg.get("architectures") or [None])[0]
    return arch, int(cfg["num_hidden_layers"])


def is_hub_id(name: str) -> bool:
    """Return whether `name` reads as a Hub repository id (org/name), not a local path."""
    return name.count("/") == 1 and not name.startswith((".", "/", "~")) and not Path(name).exists()


def _verifier(meta: dict[str, Any], verifier: str | None) -> str:
    """Return the verifier for the speculators config: the one given, else the target's recorded name.

    vLLM resolves `verifier.name_or_path` as a Hub id; a local folder is written only when nothing
    better is known, and `curator export` and `curator doctor` then say to pass --verifier.
    """
    if verifier:
        return verifier
    name = str((meta.get("target_config") or {}).get("_name_or_path") or "")
    return name if is_hub_id(name) else str(meta["target_dir"])


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


def _same_vocab(weights: dict[str, torch.Tensor]) -> bool:
    """Return whether the draft vocabulary is the whole target vocabulary, in order."""
    d2t, t2d = weights["d2t"], weights["t2d"]
    return d2t.numel() == t2d.numel() and not bool(d2t.any()) and bool(t2d.all())


def _serving_weights(
    weights: dict[str, torch.Tensor], fmt: str, embeddings: torch.Tensor | None
) -> dict[str, torch.Tensor]:
    """Return the weights renamed for `fmt`, floats in bf16, with `embeddings` only when given."""
    out = {}
    drop = {"embed_tokens.weight"} | ({"d2t", "t2d"} if _same_vocab(weights) else set())
    if embeddings is not None:
        out["embed_tokens.weight"] = embeddings.to(torch.bfloat16).contiguous()
    for name, t in weights.items():
        if name in drop:
            continue
        if fmt == "speculators" and name.startswith("midlayer."):
            name = "layers.0." + name[len("midlayer.") :]
        out[name] = (t.to(torch.bfloat16) if t.is_floating_point() else t).contiguous()
    return out


def export_checkpoint(
    ckpt_dir: str | Path, out_dir: str | Path, fmt: str = "sglang", *, verifier: str | None = None,
    target_dir: str | Path | None = None,
) -> Path:
    """Write the checkpoint (or a run's latest) as a servable draft in `fmt`; return `out_dir`.

    `verifier` is the target's Hub id for the speculators layout; `target_dir` overrides where the
    target's embeddings are read from (speculators layout) when the recorded folder moved.
    """
    if fmt not in FORMATS:
        raise TrainingError(f"unknown export format {fmt!r}; choose one of {FORMATS}")
    ckpt, meta, weights = read_checkpoint(ckpt_dir)
    cfg = DraftConfig.from_dict(meta["draft_config"])
    ids = checkpoint_layer_ids(meta)
    arch, num_layers = _target_shape(meta)
    target_cfg = meta.get("target_config") or {}
    provenance = {"checkpoint": str(ckpt.resolve()), "step": meta["step"], "target_dir": meta["target_dir"],
                  "vocab": meta.get("vocab", {}), "ttt_steps": meta.get("ttt_steps"),
                  # the layers the draft was trained on, as layer inputs, whatever the engine's numbering
                  "aux_layer_inputs": ids, "split": meta.get("split")}
    embeddings = None
    if fmt == "sglang":
        config_ids = sglang_config_ids(ids, arch, num_layers)
        eagle_config: dict[str, Any] = {"use_aux_hidden_state": True}
        if config_ids is not None:
            eagle_config["eagle_aux_hidden_state_layer_ids"] = config_ids
        config: dict[str, Any] = {
            "architectures": ["LlamaForCausalLMEagle3"],
            **_llama_fields(cfg),
            "draft_vocab_size": cfg.draft_vocab_size,
            "target_hidden_size": cfg.target_hidden_size,
            "eagle_config": eagle_config,
            # vLLM serving this layout reads the top-level key first (both of its model runners), as
            # layer inputs; SGLang's LlamaForCausalLMEagle3 reads only eagle_config's (the top-level
            # one counts the aux layers there, and the count is the same)
            "eagle_aux_hidden_state_layer_ids": ids,
            "curator": {**provenance, "sglang_layer_rule": sglang_rule(arch), "target_architecture": arch},
        }
    else:
        source = target_dir or meta["target_dir"]
        if not Path(str(source)).exists():
            raise TrainingError(f"the target folder {source} is gone; pass --target with the target's model folder "
                                "(the speculators layout carries the target's embeddings)")
        embeddings = load_embeddings(source)
        config = {
            "architectures": ["Eagle3Speculator"],
            "speculators_model_type": "eagle3",
            "transformer_layer_config": {"architectures": ["LlamaForCausalLM"], **_llama_fields(cfg)},
            "draft_vocab_size": cfg.draft_vocab_size,
            "target_hidden_size": cfg.target_hidden_size,
            "norm_before_residual": False,
            "eagle_aux_hidden_state_layer_ids": ids,
            "speculators_config": {
                "algorithm": "eagle3",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": min(3, int(meta.get("ttt_steps") or 3))}],
                "default_proposal_method": "greedy",
                "verifier": {
                    "name_or_path": _verifier(meta, verifier),
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
        save_file(_serving_weights(weights, fmt, embeddings), str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
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


def export_format(config: dict[str, Any]) -> str:
    """Return which layout an exported config.json is: "sglang" or "speculators"."""
    arch = (config.get("architectures") or [""])[0]
    if arch == "LlamaForCausalLMEagle3":
        return "sglang"
    if arch == "Eagle3Speculator":
        return "speculators"
    raise ModelMismatchError(f"config.json architecture {arch!r} is not an EAGLE-3 draft this toolkit exports")


def config_layer_ids(config: dict[str, Any]) -> list[int] | None:
    """Return the aux layer ids written in an export's config, in its engine's numbering (None: none)."""
    if export_format(config) == "sglang":
        ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    else:
        ids = config.get("eagle_aux_hidden_state_layer_ids")
    return [int(i) for i in ids] if ids else None


def served_layer_inputs(config: dict[str, Any], target_config: dict[str, Any] | None) -> list[int]:
    """Return the target layers (as inputs) the export's engine feeds the draft.

    Needs the target's config when the layout's numbering depends on it (SGLang's per-class rule,
    or no ids written at all); without it, an export of this toolkit answers from its record.
    """
    ids = config_layer_ids(config)
    if target_config is None or not target_config.get("num_hidden_layers"):
        recorded = (config.get("curator") or {}).get("aux_layer_inputs")
        if recorded:
            return sorted(int(i) for i in recorded)
        if export_format(config) == "speculators" and ids:
            return vllm_captured(ids, max(ids) + 1)
        raise ModelMismatchError("the draft's layers depend on the target; pass the target's model folder")
    n = int(target_config["num_hidden_layers"])
    if export_format(config) == "sglang":
        return sglang_captured(ids, (target_config.get("architectures") or [None])[0], n)
    return vllm_captured(ids, n)


def _config_from_export(config: dict[str, Any], target_config: dict[str, Any] | None) -> tuple[DraftConfig, str]:
    """Return (draft config, format) read from an exported config.json."""
    fmt = export_format(config)
    layer = config if fmt == "sglang" else config["transformer_layer_config"]
    layer_ids = served_layer_inputs(config, target_config)
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
    target = target_dir or (config.get("curator") or {}).get("target_dir")
    target_config = read_target_config(target) if target and Path(target).exists() else None
    try:
        cfg, fmt = _config_from_export(config, target_config)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ModelMismatchError(f"{root}/config.json lacks or garbles a field the draft needs ({exc!r}); "
                                 "re-export the draft with curator export") from exc
    weights = read_weights(root / WEIGHTS_FILE)
    if fmt == "speculators":
        weights = {("midlayer." + k[len("layers.0."):] if k.startswith("layers.0.") else k): v for k, v in weights.items()}
    draft = Eagle3Draft(cfg)
    weights = {k: (v.float() if v.is_floating_point() else v) for k, v in weights.items()}
    missing, unexpected = draft.load_state_dict(weights, strict=False)
    # d2t/t2d are left out of an export whose draft vocabulary is the target's (identity maps)
    optional = {"embed_tokens.weight"} | ({"d2t", "t2d"} if cfg.draft_vocab_size == cfg.vocab_size else set())
    if unexpected or set(missing) - optional:
        raise ModelMismatchError(f"{root} weights do not fit its config (missing {missing}, unexpected {unexpected})")
    if "embed_tokens.weight" in missing:
        if not target or not Path(target).exists():
            raise TrainingError(f"{root} has no embeddings; pass the target's model directory to load them from")
        draft.load_embeddings(load_embeddings(target))
    return draft.eval()
