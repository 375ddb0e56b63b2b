"""SGLang 0.5.23's own EAGLE-3 draft (`LlamaForCausalLMEagle3`) and layer-capture rule, run on a CPU.

Everything is SGLang's code except two things, both stated where they happen:
- the attention kernel: `RadixAttention` reads and writes KV pools that only SGLang's model
  runner builds on a GPU; `SdpaAttention` takes its place, causal SDPA at RadixAttention's own
  scaling over a plain per-layer KV cache (what the pools hold);
- the batch: a `ForwardBatch` stand-in carrying what the draft's forward reads (the target's
  hidden states in `spec_info`, an extend mode, no multimodal inputs).
Logits are `lm_head.weight` applied to the normed hidden state, as SGLang's LogitsProcessor does
at tensor-parallel size 1.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F

import cpu_stubs

cpu_stubs.install()


def init_sglang() -> None:
    """Start the single-process distributed state SGLang's layers need (as its layer unit tests do)."""
    import torch.distributed as dist
    from sglang.test.layer_ut_utils import init_single_process_dist

    if dist.is_initialized():
        return
    with socket.socket() as s:  # a free port: parallel test runs must not collide
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    init_single_process_dist(master_port=port)


class SdpaAttention(torch.nn.Module):
    """Causal SDPA in place of RadixAttention, with the KV cache its pools would hold."""

    def __init__(self, radix: Any) -> None:
        super().__init__()
        self.scaling = float(radix.scaling)
        self.heads, self.kv_heads, self.head_dim = radix.tp_q_head_num, radix.tp_k_head_num, radix.head_dim
        self.k: torch.Tensor | None = None  # (kv_heads, T, hd)
        self.v: torch.Tensor | None = None

    def crop(self, keep: int) -> None:
        if self.k is not None:
            self.k, self.v = self.k[:, :keep], self.v[:, :keep]  # type: ignore[index]

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, forward_batch: Any, **_: Any) -> torch.Tensor:
        T = q.shape[0]
        q = q.view(T, self.heads, self.head_dim).transpose(0, 1)  # (nh, T, hd)
        k = k.view(T, self.kv_heads, self.head_dim).transpose(0, 1)
        v = v.view(T, self.kv_heads, self.head_dim).transpose(0, 1)
        self.k = k if self.k is None else torch.cat([self.k, k], 1)
        self.v = v if self.v is None else torch.cat([self.v, v], 1)
        past = self.k.shape[1] - T
        # query i (absolute past+i) sees keys 0..past+i
        mask = torch.ones(T, past + T, dtype=torch.bool).tril(past)
        out = F.scaled_dot_product_attention(q, self.k, self.v, attn_mask=mask, scale=self.scaling, enable_gqa=True)
        return out.transpose(0, 1).reshape(T, self.heads * self.head_dim)


def _batch(hidden: torch.Tensor) -> Any:
    """Return what the draft's forward reads of a ForwardBatch: extend mode, no mm inputs, the states."""
    mode = SimpleNamespace(is_extend=lambda: True, is_draft_extend_v2=lambda: False)
    return SimpleNamespace(forward_mode=mode, mm_input_embeds=None, contains_mm_inputs=lambda: False,
                           spec_info=SimpleNamespace(hidden_states=hidden))


class SGLangDraft:
    """An export loaded by SGLang's LlamaForCausalLMEagle3 and its `load_weights`."""

    def __init__(self, export_dir: str | Path, target_embeddings: torch.Tensor) -> None:
        from safetensors.torch import load_file
        from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3
        from transformers import AutoConfig

        init_sglang()
        self.config = AutoConfig.from_pretrained(str(export_dir))
        self.model = LlamaForCausalLMEagle3(self.config).float().eval()
        self.attn = []
        for layer in self.model.model.layers:
            layer.self_attn.attn = SdpaAttention(layer.self_attn.attn)
            self.attn.append(layer.self_attn.attn)
        # the loaded names: every tensor of the file goes through SGLang's own loader
        self.file_weights = load_file(str(Path(export_dir) / "model.safetensors"))
        self.model.load_weights((k, v.float() if v.is_floating_point() else v) for k, v in self.file_weights.items())
        # the model runner shares the target's embedding with the draft (set_embed)
        self.model.set_embed(torch.nn.Parameter(target_embeddings.float(), requires_grad=False))

    def hot_token_id(self) -> torch.Tensor | None:
        return self.model.get_hot_token_id()

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        hot = self.hot_token_id()
        return draft_ids if hot is None else hot[draft_ids]

    def reset(self, keep: int = 0) -> None:
        for attn in self.attn:
            if keep == 0:
                attn.k = attn.v = None
            else:
                attn.crop(keep)

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (logits [T, draft_vocab], pre-norm hidden [T, H]) for one sequence's new tokens."""
        normed, (aux,) = self.model.model(input_ids, positions, _batch(hidden))
        return F.linear(normed, self.model.lm_head.weight), aux


class SGLangProposer:
    """training.eval.proposers' Proposer, drafting with SGLang's module (a chain, as topk 1 serves)."""

    def __init__(self, draft: SGLangDraft, captured_layers: list[int]) -> None:
        self.draft = draft
        self.aux_layer_ids: list[int] | None = list(captured_layers)
        self.n_real = 0

    def begin(self, prompt_ids: list[int]) -> None:
        self.draft.reset()
        self.n_real = 0

    def propose(self, tokens: torch.Tensor, aux: torch.Tensor | None, steps: int, topk: int) -> list[list[int]]:
        assert aux is not None and topk == 1, "SGLang's chain drafting: topk 1 with the target's states"
        n = tokens.shape[0]
        self.draft.reset(self.n_real)  # drop the last round's drafted positions
        ids = tokens[self.n_real + 1 : n]
        hidden = aux[self.n_real : n - 1].float()
        logits, out = self.draft.forward(ids, hidden, torch.arange(self.n_real, n - 1))
        self.n_real = n - 1
        path = [int(self.draft.to_target(logits[-1].argmax()))]
        for k in range(steps - 1):
            logits, out = self.draft.forward(torch.tensor([path[-1]]), out[-1:], torch.tensor([n - 1 + k]))
            path.append(int(self.draft.to_target(logits[-1].argmax())))
        return [path]


def config_layer_ids(export_dir: str | Path) -> list[int] | None:
    """Return the ids SGLang's model runner passes to the target: eagle_config's, else None.

    (sglang/srt/model_executor/model_runner_components/spec_aux_hidden_state.py reads
    `hf_config.eagle_config["eagle_aux_hidden_state_layer_ids"]`, any failure meaning None.)
    """
    config = json.loads((Path(export_dir) / "config.json").read_text())
    try:
        return config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    except (KeyError, TypeError):
        return None


def target_class(architecture: str) -> type:
    """Return SGLang's target model class for a config.json architecture."""
    import importlib

    module = {"LlamaForCausalLM": "llama", "Qwen3ForCausalLM": "qwen3", "DeepseekV3ForCausalLM": "deepseek_v2",
              "GptOssForCausalLM": "gpt_oss"}[architecture]
    return getattr(importlib.import_module(f"sglang.srt.models.{module}"), architecture)


def sglang_layers_to_capture(architecture: str, num_layers: int, config_ids: list[int] | None) -> list[int]:
    """Return `model.layers_to_capture` as the target class's real `set_eagle3_layers_to_capture` sets it.

    The method touches only `pp_group.is_last_rank`, `config.num_hidden_layers` and `model`; it
    runs on an object holding just those.
    """
    holder = SimpleNamespace(pp_group=SimpleNamespace(is_last_rank=True),
                             config=SimpleNamespace(num_hidden_layers=num_layers), model=SimpleNamespace())
    target_class(architecture).set_eagle3_layers_to_capture(holder, None if config_ids is None else list(config_ids))
    return list(holder.model.layers_to_capture)


def captured_by_model_loop(layers_to_capture: list[int], architecture: str, num_layers: int) -> list[int]:
    """Return the layer inputs the target's forward captures, in the order it concatenates them.

    The models' loops (llama.py, qwen3.py, deepseek_v2.py: `capture_output=... if i in
    self.layers_to_capture` for i in range(N); gpt_oss.py also `self.end_layer in
    self.layers_to_capture` at the final norm) test membership while walking the layers in order.
    """
    top = num_layers + 1 if architecture == "GptOssForCausalLM" else num_layers
    return [i for i in range(top) if i in layers_to_capture]
