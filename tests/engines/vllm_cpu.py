"""vLLM 0.33.0's reading of a draft export, on a CPU: its real config parser, its real runners'
layer-id readers and its real `load_weights` decisions, on a module skeleton with vLLM's names.

vLLM cannot build its layers without a GPU. What stands in: `DraftSkeleton` and `ModelSkeleton`
hold parameters named and shaped as vLLM's Eagle3LlamaForCausalLM builds them (packed qkv_proj
and gate_up_proj, draft_id_to_target_id only when the vocabularies differ); the packed ones get a
weight_loader that writes each shard into its rows, as vLLM's QKV/merged linear layers do at
tensor-parallel size 1. The methods that decide what is loaded where are vLLM's own:
`Eagle3LlamaForCausalLM.load_weights`, the eagle3 `LlamaModel.load_weights` with its
`hf_to_vllm_mapper`, `AutoWeightsLoader` and `WeightsMapper`.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

import cpu_stubs

cpu_stubs.install()

from vllm.model_executor.models import llama_eagle3  # noqa: E402


def _packed(rows: list[int], cols: int, shard_ids: list[Any]) -> nn.Parameter:
    """A packed parameter whose loader places shard `id` at its rows, as vLLM's linear layers do (TP 1)."""
    param = nn.Parameter(torch.full((sum(rows), cols), float("nan")), requires_grad=False)
    starts = dict(zip(shard_ids, [sum(rows[:i]) for i in range(len(rows))]))

    def weight_loader(p: nn.Parameter, loaded: torch.Tensor, shard_id: Any = None) -> None:
        # vLLM's WeightsMapper tags each stacked shard's tensor with its id (`tensor.shard_id`)
        start = starts[getattr(loaded, "shard_id", shard_id)]
        p.data[start : start + loaded.shape[0]].copy_(loaded)

    param.weight_loader = weight_loader  # type: ignore[attr-defined]
    return param


def _plain(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.full(shape, float("nan")), requires_grad=False)


class ModelSkeleton(nn.Module):
    """vLLM's eagle3 LlamaModel parameters, loaded by its own load_weights."""

    load_weights = llama_eagle3.LlamaModel.load_weights
    hf_to_vllm_mapper = llama_eagle3.LlamaModel.hf_to_vllm_mapper

    def __init__(self, cfg: dict[str, Any], target_hidden: int) -> None:
        super().__init__()
        H, V, I = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
        hd = cfg.get("head_dim") or H // cfg["num_attention_heads"]
        q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
        self.use_aux_hidden_state, self.norm_before_fc = True, False
        self.embed_tokens = nn.Module()
        self.embed_tokens.weight = _plain(V, H)
        self.fc = nn.Module()
        self.fc.weight = _plain(H, 3 * target_hidden)
        layer = nn.Module()
        layer.self_attn, layer.mlp = nn.Module(), nn.Module()
        layer.self_attn.qkv_proj, layer.self_attn.o_proj = nn.Module(), nn.Module()
        layer.self_attn.qkv_proj.weight = _packed([q, kv, kv], 2 * H, ["q", "k", "v"])
        layer.self_attn.o_proj.weight = _plain(H, q)
        layer.mlp.gate_up_proj, layer.mlp.down_proj = nn.Module(), nn.Module()
        layer.mlp.gate_up_proj.weight = _packed([I, I], H, [0, 1])
        layer.mlp.down_proj.weight = _plain(H, I)
        for norm in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
            setattr(layer, norm, nn.Module())
            getattr(layer, norm).weight = _plain(H)
        self.layers = nn.ModuleList([layer])
        self.norm = nn.Module()
        self.norm.weight = _plain(H)


class DraftSkeleton(nn.Module):
    """vLLM's Eagle3LlamaForCausalLM parameters, loaded by its own load_weights."""

    load_weights = llama_eagle3.Eagle3LlamaForCausalLM.load_weights

    def __init__(self, cfg: dict[str, Any], target_hidden: int, target_vocab: int) -> None:
        super().__init__()
        self.use_parallel_drafting = False
        self.model = ModelSkeleton(cfg, target_hidden)
        self.lm_head = nn.Module()
        self.lm_head.weight = _plain(cfg["draft_vocab_size"], cfg["hidden_size"])
        # vLLM creates the mapping only when the vocabularies differ (Eagle3LlamaForCausalLM.__init__)
        if cfg["draft_vocab_size"] != target_vocab:
            self.draft_id_to_target_id = nn.Parameter(torch.zeros(cfg["draft_vocab_size"], dtype=torch.long),
                                                      requires_grad=False)
        else:
            self.draft_id_to_target_id = None


def parsed_config(export_dir: str | Path) -> Any:
    """Return the draft's hf_config as vLLM builds it: SpeculatorsConfig for that layout, else transformers'."""
    from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

    raw = json.loads((Path(export_dir) / "config.json").read_text())
    if "speculators_model_type" in raw:
        return SpeculatorsConfig.from_pretrained(str(export_dir))
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(export_dir))


def runner_layer_ids(hf_config: Any) -> dict[str, tuple[int, ...] | None]:
    """Return the aux layer ids each of vLLM's model runners reads from a draft's hf_config."""
    from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import get_eagle3_aux_layers_from_config
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    spec = SimpleNamespace(draft_model_config=SimpleNamespace(hf_config=hf_config))
    return {"v2": get_eagle3_aux_layers_from_config(spec),
            "v1": GPUModelRunner._get_eagle3_aux_layers_from_config(SimpleNamespace(speculative_config=spec))}
