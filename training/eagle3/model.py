"""The EAGLE-3 draft model in one file: fc over three target states, one decoder layer, norm, lm_head.

    hidden [B, T, 3*Ht] --fc--> [B, T, H] ---------------------------+ residual
    input_ids [B, T] --embed_tokens (frozen, the target's)--> [B, T, H]
        midlayer: cat(input_layernorm(embeds), hidden_norm(hidden)) [B, T, 2H]
                  -> self_attn (q/k/v take 2H) -> + residual
                  -> post_attention_layernorm -> SwiGLU mlp -> + residual   = next hidden [B, T, H]
        norm -> lm_head [draft_vocab, H] -> logits [B, T, draft_vocab]

The hidden state returned is the pre-norm one: the next drafting step (or TTT step) feeds it back
in place of the target's states, and then `fc` is skipped because its width is H, not 3*Ht (as
SGLang does). Parameter names follow SGLang's `LlamaForCausalLMEagle3`, so export is a rename at most.
Draft token i stands for target token `i + d2t[i]`; `t2d[j]` says whether target token j has one.

EAGLE-3.1's normalisations (DraftConfig's four flags, named and placed as speculators 0.9.0, vLLM
0.33 and SGLang 0.5.23 define them; docs/eagle3-variants.md has the table):
- `norm_before_fc`: one RMSNorm `input_norm` [n_aux*Ht] over the concatenated aux states before fc;
- `fc_norm`: one RMSNorm per aux state, `fc_norm.{i}` [Ht], before concatenation (exclusive with the above);
- `norm_before_residual`: the midlayer's residual is the hidden_norm'ed hidden, not the raw one;
- `norm_output`: the hidden fed back to the next step is the post-`norm` one (logits are unchanged).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import torch
import torch.nn as nn
import torch.nn.functional as F

from training.eagle3 import kernels
from training.eagle3.config_check import DRAFT_ROPE_TYPES, MAX_DIM, MAX_ELEMENTS
from training.errors import ModelMismatchError
from training.runtime.profiling import phase
from training.target.config import text_part

SUPPORTED_ROPE_TYPES = DRAFT_ROPE_TYPES
# EAGLE-3.1's normalisation flags, under the config keys speculators, vLLM and SGLang read
VARIANT_KEYS = ("norm_before_fc", "fc_norm", "norm_before_residual", "norm_output")


@dataclass
class DraftConfig:
    hidden_size: int = 4096  # H: the draft's width, the target's hidden size (embeddings are shared)
    target_hidden_size: int | None = None  # Ht: width of one captured target state (None: = H)
    num_attention_heads: int = 32
    num_key_value_heads: int = 8
    head_dim: int | None = None  # None: H // num_attention_heads
    intermediate_size: int = 14336
    vocab_size: int = 128256  # the target's vocabulary (embeddings, t2d)
    draft_vocab_size: int = 32000
    num_aux_layers: int = 3
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None  # {"rope_type": "linear"|"llama3", "factor": ...}
    max_position_embeddings: int = 8192
    aux_layer_ids: list[int] = field(default_factory=list)  # SGLang convention: inputs of these layers
    # EAGLE-3.1's normalisations (module docstring); all off: plain EAGLE-3
    norm_before_fc: bool = False
    fc_norm: bool = False
    norm_before_residual: bool = False
    norm_output: bool = False

    def __post_init__(self) -> None:
        self._check_sizes()
        if self.norm_before_fc and self.fc_norm:
            raise ModelMismatchError("norm_before_fc and fc_norm are exclusive (one norm over the concatenated aux "
                                     "states, or one per state): set one of them")
        if self.target_hidden_size is None:
            self.target_hidden_size = self.hidden_size
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_attention_heads % self.num_key_value_heads:
            raise ModelMismatchError(
                f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads {self.num_key_value_heads}"
            )
        if self.draft_vocab_size > self.vocab_size:
            raise ModelMismatchError(
                f"draft_vocab_size {self.draft_vocab_size} exceeds the target vocab {self.vocab_size}"
            )
        rope_type = (self.rope_scaling or {}).get("rope_type", "default")
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ModelMismatchError(
                f"rope type {rope_type!r} is not supported by the draft (use one of {SUPPORTED_ROPE_TYPES})"
            )

    def _check_sizes(self) -> None:
        """Refuse sizes no draft has, before anything is allocated from them: a config.json is a file
        (an export's `vocab_size: 2e9` would otherwise make eval try to allocate a terabyte)."""
        sizes = {"hidden_size": self.hidden_size, "target_hidden_size": self.target_hidden_size,
                 "num_attention_heads": self.num_attention_heads, "num_key_value_heads": self.num_key_value_heads,
                 "head_dim": self.head_dim, "intermediate_size": self.intermediate_size, "vocab_size": self.vocab_size,
                 "draft_vocab_size": self.draft_vocab_size, "num_aux_layers": self.num_aux_layers}
        for name, value in sizes.items():
            if value is None and name in ("target_hidden_size", "head_dim"):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_DIM[name]:
                raise ModelMismatchError(f"draft config {name} {value!r} is not a size a draft has "
                                         f"(1..{MAX_DIM[name]:,}); the config.json is damaged or not a draft's")
        h, ht = self.hidden_size, self.target_hidden_size or self.hidden_size
        elements = (self.vocab_size + self.draft_vocab_size + 3 * self.intermediate_size + self.num_aux_layers * ht
                    + 4 * self.num_attention_heads * (self.head_dim or h // self.num_attention_heads)) * h
        if elements > MAX_ELEMENTS:
            raise ModelMismatchError(f"draft config sizes (hidden {h}, vocab {self.vocab_size}, intermediate "
                                     f"{self.intermediate_size}) make {elements:,} weights, more than any draft "
                                     f"({MAX_ELEMENTS:,}); the config.json is damaged or not a draft's")

    @property
    def fused_width(self) -> int:
        """Return the width of the concatenated aux states, num_aux_layers * Ht."""
        return self.num_aux_layers * int(self.target_hidden_size)  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, Any]:
        """Return the config as a JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DraftConfig:
        """Return a config from `to_dict` output; unknown keys are refused."""
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ModelMismatchError(f"unknown draft config keys: {unknown}")
        return cls(**data)

    def variant(self) -> dict[str, bool]:
        """Return the EAGLE-3.1 normalisation flags (all False: plain EAGLE-3)."""
        return {name: bool(getattr(self, name)) for name in VARIANT_KEYS}

    @classmethod
    def from_target_config(
        cls,
        target: dict[str, Any],
        *,
        draft_vocab_size: int,
        aux_layer_ids: list[int],
        intermediate_size: int | None = None,
        variant: dict[str, bool] | None = None,
    ) -> DraftConfig:
        """Return the draft config for a target's config.json dict (text_config used when nested).

        Heads, head_dim, eps and rope follow the target; a rope scaling the draft does not
        implement falls back to plain rope (the draft's own config.json records what it used).
        """
        t = text_part(target)
        rope = dict(t.get("rope_parameters") or t.get("rope_scaling") or {})
        theta = float(t.get("rope_theta") or rope.get("rope_theta") or 10000.0)
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        scaling = None
        if rope_type in ("linear", "llama3"):
            scaling = {k: v for k, v in rope.items() if k not in ("rope_theta", "type")}
            scaling["rope_type"] = rope_type
        hidden = int(t["hidden_size"])
        heads = int(t["num_attention_heads"])
        return cls(
            hidden_size=hidden,
            target_hidden_size=hidden,
            num_attention_heads=heads,
            num_key_value_heads=int(t.get("num_key_value_heads") or heads),
            head_dim=int(t.get("head_dim") or hidden // heads),
            intermediate_size=int(intermediate_size or t.get("intermediate_size") or 4 * hidden),
            vocab_size=int(t["vocab_size"]),
            draft_vocab_size=min(int(draft_vocab_size), int(t["vocab_size"])),
            rms_norm_eps=float(t.get("rms_norm_eps", 1e-5)),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=int(t.get("max_position_embeddings", 8192)),
            aux_layer_ids=[int(i) for i in aux_layer_ids],
            num_aux_layers=len(aux_layer_ids) or 3,
            **{k: bool(v) for k, v in (variant or {}).items()},
        )


@dataclass
class DraftOutput:
    logits: torch.Tensor  # [B, T, draft_vocab]
    hidden: torch.Tensor  # [B, T, H], fed back as the next step's hidden (pre-norm; post-norm with norm_output)
    cache: Cache | None


class Cache(Protocol):
    """What the attention asks of a cache: where new positions start, and attention over it."""

    def position_offset(self) -> int: ...

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...


def _expand_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """Return kv heads repeated for grouped-query attention: (B, nkv, T, hd) -> (B, nkv*n_rep, T, hd)."""
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=1)


class KVCache:
    """Keys and values of every position seen so far, for drafting token by token at inference.

    After verification, `crop(n)` drops the positions of rejected draft tokens.
    """

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None  # (B, nkv, L, hd)
        self.v: torch.Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def position_offset(self) -> int:
        """Return the position of the next token: the number cached."""
        return len(self)

    def crop(self, n: int) -> None:
        """Keep only the first `n` positions."""
        if self.k is not None:
            self.k, self.v = self.k[:, :, :n], self.v[:, :, :n]  # type: ignore[index]

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Append k, v; return causal attention of q (the newest positions) over everything cached."""
        past = len(self)
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        n_rep = q.shape[1] // k.shape[1]
        keys, values = _expand_kv(self.k, n_rep), _expand_kv(self.v, n_rep)  # (B, nh, L+T, hd)
        t_new, total = q.shape[2], past + q.shape[2]
        if t_new == 1:
            return F.scaled_dot_product_attention(q, keys, values)
        # query i (absolute position past+i) sees keys 0..past+i
        mask = torch.ones(t_new, total, dtype=torch.bool, device=q.device).tril(diagonal=past)
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)


class TTTCache:
    """Keys and values of each training-time-test step, as SpecForge arranges them.

    Step 0 runs over the whole sequence with causal attention. At step k, the query of chain
    origin t (its position t+k) sees the step-0 keys of positions <= t (the target-fed prefix)
    and the keys of steps 1..k at origin t only (its own earlier draft tokens): exactly what the
    draft sees at inference after drafting k tokens from position t.
    """

    def __init__(self) -> None:
        self.keys: list[torch.Tensor] = []  # per step: (B, nkv, T, hd)
        self.values: list[torch.Tensor] = []

    def position_offset(self) -> int:
        """Return the step index: step k puts origin t at position t + k."""
        return len(self.keys)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Append this step's k, v; return the attention of q over step 0 (causal) and the diagonals."""
        with phase("attention"):
            return self._attend(q, k, v)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.keys.append(k)
        self.values.append(v)
        n_rep = q.shape[1] // k.shape[1]
        k0, v0 = _expand_kv(self.keys[0], n_rep), _expand_kv(self.values[0], n_rep)  # (B, nh, T, hd)
        if len(self.keys) == 1:
            return F.scaled_dot_product_attention(q, k0, v0, is_causal=True)
        T, scale = q.shape[2], 1.0 / math.sqrt(q.shape[-1])
        causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        scores0 = (q @ k0.transpose(-2, -1)) * scale  # (B, nh, T, T)
        scores0 = scores0.masked_fill(~causal, float("-inf"))
        later_k = [_expand_kv(x, n_rep) for x in self.keys[1:]]
        later_v = [_expand_kv(x, n_rep) for x in self.values[1:]]
        diag = [(q * ks).sum(-1, keepdim=True) * scale for ks in later_k]  # k x (B, nh, T, 1)
        probs = torch.cat([scores0, *diag], dim=-1).float().softmax(dim=-1).to(q.dtype)  # (B, nh, T, T+k)
        y = probs[..., :T] @ v0  # (B, nh, T, hd)
        for i, vs in enumerate(later_v):
            y = y + probs[..., T + i : T + i + 1] * vs
        return y


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernels.rms_norm(x, self.weight, self.eps)


def rope_inv_freq(cfg: DraftConfig) -> torch.Tensor:
    """Return the rotary inverse frequencies [head_dim // 2], with linear or llama3 scaling applied."""
    hd = int(cfg.head_dim)  # type: ignore[arg-type]
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    scaling = cfg.rope_scaling or {}
    rope_type = scaling.get("rope_type", "default")
    if rope_type == "linear":
        inv_freq = inv_freq / float(scaling["factor"])
    elif rope_type == "llama3":
        factor = float(scaling["factor"])
        low, high = float(scaling.get("low_freq_factor", 1.0)), float(scaling.get("high_freq_factor", 4.0))
        old_len = float(scaling.get("original_max_position_embeddings", 8192))
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        inv_freq = torch.where(medium, smoothed, scaled)
    return inv_freq.float()


class Rotary(nn.Module):
    inv_freq: torch.Tensor  # a buffer, [head_dim // 2]

    def __init__(self, cfg: DraftConfig) -> None:
        super().__init__()
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)

    def forward(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[..., None].float() * self.inv_freq  # (B, T, hd/2)
        emb = torch.cat([freqs, freqs], dim=-1)  # (B, T, hd)
        return emb.cos(), emb.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Return x (B, n, T, hd) rotated by the (B, T, hd) angles."""
    cos, sin = cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)
    return kernels.rotary(x, cos, sin)  # x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, cfg: DraftConfig) -> None:
        super().__init__()
        H, hd = cfg.hidden_size, int(cfg.head_dim)  # type: ignore[arg-type]
        self.n_head, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, hd
        # q/k/v read the normed embedding and normed hidden side by side: 2H wide
        self.q_proj = nn.Linear(2 * H, self.n_head * hd, bias=False)
        self.k_proj = nn.Linear(2 * H, self.n_kv * hd, bias=False)
        self.v_proj = nn.Linear(2 * H, self.n_kv * hd, bias=False)
        self.o_proj = nn.Linear(self.n_head * hd, H, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: Cache | None) -> torch.Tensor:
        B, T, _ = x.shape  # x: (B, T, 2H)
        q = self.q_proj(x).view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, nh, T, hd)
        k = self.k_proj(x).view(B, T, self.n_kv, self.head_dim).transpose(1, 2)  # (B, nkv, T, hd)
        v = self.v_proj(x).view(B, T, self.n_kv, self.head_dim).transpose(1, 2)  # (B, nkv, T, hd)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if cache is None:
            n_rep = self.n_head // self.n_kv
            y = F.scaled_dot_product_attention(q, _expand_kv(k, n_rep), _expand_kv(v, n_rep), is_causal=True)
        else:
            y = cache.attend(q, k, v)  # (B, nh, T, hd)
        y = y.transpose(1, 2).reshape(B, T, self.n_head * self.head_dim)  # (B, T, nh*hd)
        return self.o_proj(y)  # (B, T, H)


class MLP(nn.Module):
    def __init__(self, cfg: DraftConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(kernels.swiglu(self.gate_proj(x), self.up_proj(x)))  # SwiGLU


class DecoderLayer(nn.Module):
    """The midlayer: a Llama decoder layer whose attention reads [normed embeds, normed hidden]."""

    def __init__(self, cfg: DraftConfig) -> None:
        super().__init__()
        self.norm_before_residual = cfg.norm_before_residual
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(
        self, embeds: torch.Tensor, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: Cache | None
    ) -> torch.Tensor:
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden  # (B, T, H)
        x = torch.cat([self.input_layernorm(embeds), normed], dim=-1)  # (B, T, 2H)
        h = residual + self.self_attn(x, cos, sin, cache)  # (B, T, H)
        return h + self.mlp(self.post_attention_layernorm(h))  # (B, T, H)


class Eagle3Draft(nn.Module):
    d2t: torch.Tensor  # buffers: [draft_vocab] int64 (target id - draft id)
    t2d: torch.Tensor  # [target_vocab] bool (which target ids the draft has)

    def __init__(self, cfg: DraftConfig) -> None:
        super().__init__()
        self.config = cfg
        H = cfg.hidden_size
        # the target's embeddings, loaded by `load_embeddings` and never trained
        self.embed_tokens = nn.Embedding.from_pretrained(torch.zeros(cfg.vocab_size, H), freeze=True)
        self.fc = nn.Linear(cfg.fused_width, H, bias=False)  # [H, 3*Ht]
        # EAGLE-3.1: one norm over the fused aux states, or one per state (RMSNorm weights start at 1)
        self.input_norm = RMSNorm(cfg.fused_width, cfg.rms_norm_eps) if cfg.norm_before_fc else None
        self.fc_norm = (nn.ModuleList(RMSNorm(int(cfg.target_hidden_size), cfg.rms_norm_eps)  # type: ignore[arg-type]
                                      for _ in range(cfg.num_aux_layers)) if cfg.fc_norm else None)
        self.midlayer = DecoderLayer(cfg)
        self.norm = RMSNorm(H, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(H, cfg.draft_vocab_size, bias=False)  # [draft_vocab, H]
        self.rotary = Rotary(cfg)
        # identity mapping until a vocabulary is set: draft id i is target id i
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
        t2d[: cfg.draft_vocab_size] = True
        self.register_buffer("t2d", t2d)
        for module in (self.fc, self.lm_head, *self.midlayer.self_attn.children(), *self.midlayer.mlp.children()):
            assert isinstance(module, nn.Linear)  # the fc, the head and every child of attention and MLP
            nn.init.normal_(module.weight, std=0.02)

    def load_embeddings(self, weight: torch.Tensor) -> None:
        """Copy the target's input embeddings [V, H] in (kept frozen)."""
        if tuple(weight.shape) != tuple(self.embed_tokens.weight.shape):
            raise ModelMismatchError(
                f"target embeddings are {tuple(weight.shape)}, the draft expects {tuple(self.embed_tokens.weight.shape)}"
            )
        with torch.no_grad():
            self.embed_tokens.weight.copy_(weight.to(self.embed_tokens.weight.dtype))

    def set_vocab(self, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
        """Set the draft vocabulary: d2t [draft_vocab] (target id - draft id), t2d [target_vocab] bool."""
        if d2t.shape != self.d2t.shape or t2d.shape != self.t2d.shape:
            raise ModelMismatchError(
                f"vocab maps {tuple(d2t.shape)}/{tuple(t2d.shape)} do not fit draft "
                f"{tuple(self.d2t.shape)}/{tuple(self.t2d.shape)}"
            )
        self.d2t.copy_(d2t.long())
        self.t2d.copy_(t2d.bool())

    def draft_ids(self) -> torch.Tensor:
        """Return the target id of every draft token: [draft_vocab] int64."""
        return torch.arange(self.config.draft_vocab_size, device=self.d2t.device) + self.d2t

    def draft_to_target(self, ids: torch.Tensor) -> torch.Tensor:
        """Return target token ids for draft token ids (any shape)."""
        return ids + self.d2t[ids]

    def init_lm_head_from_target(self, target_lm_head: torch.Tensor) -> None:
        """Start lm_head from the target's rows [V, H] for the draft's tokens (faster to train)."""
        with torch.no_grad():
            device = self.lm_head.weight.device
            rows = target_lm_head.to(device)[self.draft_ids().to(device)]
            self.lm_head.weight.copy_(rows.to(self.lm_head.weight.dtype))

    def forward(
        self,
        input_ids: torch.Tensor,
        hidden: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        cache: Cache | None = None,
    ) -> DraftOutput:
        """Return logits over the draft vocab and the next hidden state for each position.

        input_ids [B, T]; hidden [B, T, 3*Ht] (the target's aux states, fused by fc) or [B, T, H]
        (the draft's own previous output, fc skipped). position_ids default to the cache's offset
        plus arange(T).
        """
        B, T = input_ids.shape
        if hidden.shape[-1] == self.config.fused_width:
            hidden = self.fc(self.normed_aux(hidden))  # (B, T, 3*Ht) -> (B, T, H)
        elif hidden.shape[-1] != self.config.hidden_size:
            raise ModelMismatchError(
                f"hidden width {hidden.shape[-1]} is neither the fused aux width {self.config.fused_width} "
                f"nor the draft width {self.config.hidden_size}"
            )
        if position_ids is None:
            offset = cache.position_offset() if cache is not None else 0
            position_ids = torch.arange(offset, offset + T, device=input_ids.device).expand(B, T)
        embeds = self.embed_tokens(input_ids).to(hidden.dtype)  # (B, T, H)
        cos, sin = self.rotary(position_ids)  # (B, T, hd)
        hidden = self.midlayer(embeds, hidden, cos, sin, cache)  # (B, T, H)
        normed = self.norm(hidden)
        logits = self.lm_head(normed)  # (B, T, draft_vocab)
        return DraftOutput(logits=logits, hidden=normed if self.config.norm_output else hidden, cache=cache)

    def normed_aux(self, aux: torch.Tensor) -> torch.Tensor:
        """Return the concatenated aux states [.., n_aux*Ht] as fc reads them: through `input_norm`
        (norm_before_fc) or each state through its `fc_norm` (fc_norm), else as they are."""
        if self.input_norm is not None:
            return self.input_norm(aux)
        if self.fc_norm is not None:
            chunks = aux.chunk(len(self.fc_norm), dim=-1)
            return torch.cat([norm(chunk) for norm, chunk in zip(self.fc_norm, chunks, strict=True)], dim=-1)
        return aux

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """Return the state dict without the frozen target embeddings (what checkpoints store)."""
        return {k: v for k, v in self.state_dict().items() if k != "embed_tokens.weight"}
