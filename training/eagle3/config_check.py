"""The one check of an exported draft that `curator doctor` and `load_draft` (so `curator eval`) share:
its config's values and its tensors' names, dtypes and shapes.

Everything here is what an engine (SGLang, vLLM) or the toolkit's own draft builds from the file, so a
value no model has is refused before either runs: heads that do not divide the width (the engines
build other projections than the file holds), an rms_norm_eps of NaN or a rope factor of 1e30 (the
draft computes NaN or constant positions and proposes nothing: acceptance 1.0, nothing fails), a dtype
no engine knows, integer weights (quantised without scales: read as numbers, they are noise), a tensor
no EAGLE-3 draft has. fc, lm_head and d2t/t2d are judged by training/eagle3/weights.py (check_servable)
and by the doctor's own lines, which say more about them. No torch here: the doctor reads a config and
the safetensors headers without loading it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

# Bounds on what a config file may state (the largest real targets are far inside them): checked
# before a tensor is allocated from them.
MAX_DIM = {"hidden_size": 1 << 16, "target_hidden_size": 1 << 16, "num_attention_heads": 1 << 10,
           "num_key_value_heads": 1 << 10, "head_dim": 1 << 12, "intermediate_size": 1 << 19, "vocab_size": 1 << 23,
           "draft_vocab_size": 1 << 23, "num_aux_layers": 1 << 6}
MAX_ELEMENTS = 1 << 34  # 17G weights: 32 GiB in bf16, several times a real draft with its embeddings
# Llama 4 states 10M positions; nothing states 2^27 (and a negative or zero count has no positions at all)
MAX_POSITIONS = 1 << 27
# No model stretches its positions by more than this (Llama 3 and DeepSeek's YaRN use 8 to 40)
MAX_ROPE_FACTOR = 1024.0
# The rope types the toolkit's draft computes (training/eagle3/model.py rope_inv_freq); the engines
# also build these others, so an export from elsewhere may carry one: served, but not measurable here
DRAFT_ROPE_TYPES = ("default", "linear", "llama3")
ENGINE_ROPE_TYPES = (*DRAFT_ROPE_TYPES, "dynamic", "yarn", "longrope")
# The dtypes a config may name (transformers and the engines turn the name into a torch dtype)
CONFIG_DTYPES = ("bfloat16", "float16", "float32")
# safetensors header dtypes: weights are floats; d2t an integer offset; t2d a mask (bool, or integer 0/1)
FLOAT_DTYPES = frozenset({"BF16", "F16", "F32", "F64"})
INT_DTYPES = frozenset({"I8", "I16", "I32", "I64", "U8", "U16", "U32", "U64"})


def _size(value: Any) -> int | None:
    """Return a JSON integer (not a bool, not 4.0), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: Any) -> float | None:
    """Return a finite JSON number as a float, else None (NaN, inf, a 4,000-digit integer, a string, a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def config_value_problems(layer: Mapping[str, Any], top: Mapping[str, Any]) -> list[str]:
    """Return what is wrong with the values of a draft's decoder config `layer` (and the export's `top`
    level, which holds draft_vocab_size and target_hidden_size): each problem one sentence."""
    return size_problems(layer, top) + _other_value_problems(layer, top)


def size_problems(layer: Mapping[str, Any], top: Mapping[str, Any]) -> list[str]:
    """Return what is wrong with the sizes the draft's weights are built from (widths, heads, vocabularies)."""
    problems: list[str] = []
    sizes: dict[str, int] = {}
    fields = {"hidden_size": layer, "num_attention_heads": layer, "num_key_value_heads": layer, "head_dim": layer,
              "intermediate_size": layer, "vocab_size": layer, "draft_vocab_size": top, "target_hidden_size": top}
    optional = {"num_key_value_heads", "head_dim", "target_hidden_size"}
    for name, block in fields.items():
        value = block.get(name)
        if value is None and (name in optional or name not in block):
            if name not in optional:
                problems.append(f"{name} is missing: the engines build the draft from it")
            continue
        size = _size(value)
        if size is None or not 0 < size <= MAX_DIM[name]:
            problems.append(f"{name}={_short(value)} is not a size a draft has (an integer in 1..{MAX_DIM[name]:,})")
        else:
            sizes[name] = size
    h, heads, kv = sizes.get("hidden_size"), sizes.get("num_attention_heads"), sizes.get("num_key_value_heads")
    if h and heads and "head_dim" not in sizes and "head_dim" not in layer and h % heads:
        problems.append(f"hidden_size {h} is not divisible by num_attention_heads {heads} (and no head_dim is "
                        "given): the engines and the draft cannot split it into heads")
    if heads and kv and heads % kv:
        problems.append(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}: "
                        "grouped-query attention cannot share the key/value heads")
    vocab, dvocab = sizes.get("vocab_size"), sizes.get("draft_vocab_size")
    if vocab and dvocab and dvocab > vocab:
        problems.append(f"draft_vocab_size {dvocab} exceeds vocab_size {vocab}")
    if h and heads and vocab and dvocab and "intermediate_size" in sizes:
        hd = sizes.get("head_dim") or h // heads
        elements = (vocab + dvocab + 3 * sizes["intermediate_size"] + 3 * sizes.get("target_hidden_size", h)
                    + 4 * heads * hd) * h
        if elements > MAX_ELEMENTS:
            problems.append(f"the sizes make {elements:,} weights, more than any draft ({MAX_ELEMENTS:,})")
    return problems


def _other_value_problems(layer: Mapping[str, Any], top: Mapping[str, Any]) -> list[str]:
    """Return what is wrong with the config's other values: positions, norm epsilon, rope, dtype, activation."""
    problems: list[str] = []
    if "max_position_embeddings" in layer:
        positions = _size(layer["max_position_embeddings"])
        if positions is None or not 0 < positions <= MAX_POSITIONS:
            problems.append(f"max_position_embeddings={_short(layer['max_position_embeddings'])} is not a position "
                            f"count (an integer in 1..{MAX_POSITIONS:,})")
    if "rms_norm_eps" in layer:
        eps = _number(layer["rms_norm_eps"])
        if eps is None or not 0 < eps < 1:
            problems.append(f"rms_norm_eps={_short(layer['rms_norm_eps'])} is not a norm epsilon (a number in (0, 1)): "
                            "every norm of the draft would output NaN or noise and it would propose nothing")
    if "rope_theta" in layer and layer["rope_theta"] is not None:
        theta = _number(layer["rope_theta"])
        if theta is None or theta <= 1:
            problems.append(f"rope_theta={_short(layer['rope_theta'])} is not a rotary base (a number above 1)")
    problems += rope_scaling_problems(layer.get("rope_scaling"))
    for block in ([top] if layer is top else [top, layer]):  # SGLang's layout: one block for both
        for key in ("torch_dtype", "dtype"):
            if key in block and block[key] is not None and block[key] not in CONFIG_DTYPES:
                problems.append(f"{key}={_short(block[key])} is not a dtype the engines load a draft in "
                                f"({', '.join(CONFIG_DTYPES)})")
    act = layer.get("hidden_act")
    if act is not None and act != "silu":
        problems.append(f"hidden_act={_short(act)}: an EAGLE-3 draft's MLP is SwiGLU (silu); the engines would "
                        "build another MLP than the one trained")
    return problems


def rope_scaling_problems(scaling: Any) -> list[str]:
    """Return what is wrong with a `rope_scaling` block (None: plain rope, fine)."""
    if scaling is None:
        return []
    if not isinstance(scaling, dict):
        return [f"rope_scaling={_short(scaling)} is not an object"]
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in ENGINE_ROPE_TYPES:
        return [f"rope_scaling type {_short(kind)} is not one the engines build ({', '.join(ENGINE_ROPE_TYPES)})"]
    problems = []
    if kind != "default" or "factor" in scaling:
        factor = _number(scaling.get("factor"))
        if factor is None or not 1 <= factor <= MAX_ROPE_FACTOR:
            problems.append(f"rope_scaling factor {_short(scaling.get('factor'))} is not a context stretch (a number "
                            f"in 1..{MAX_ROPE_FACTOR:g}): the draft's positions would collapse and it would propose nothing")
    if kind == "llama3":
        low, high = _number(scaling.get("low_freq_factor", 1.0)), _number(scaling.get("high_freq_factor", 4.0))
        old = _size(scaling.get("original_max_position_embeddings", 8192))
        if low is None or high is None or not 0 < low < high or old is None or not 0 < old <= MAX_POSITIONS:
            problems.append("rope_scaling llama3 needs 0 < low_freq_factor < high_freq_factor and a positive "
                            "original_max_position_embeddings")
    return problems


def rope_measurable(scaling: Any) -> bool:
    """Return whether the toolkit's draft computes this rope (else `curator eval` cannot measure the export)."""
    if not isinstance(scaling, dict):
        return scaling is None
    return scaling.get("rope_type", scaling.get("type", "default")) in DRAFT_ROPE_TYPES


def expected_shapes(layer: Mapping[str, Any], top: Mapping[str, Any], n_aux: int) -> dict[str, tuple[int, ...]]:
    """Return the shapes (toolkit names) of the decoder layer, the norms and the embedding that the
    config implies; {} when its sizes are not sound (size_problems says why)."""
    if size_problems(layer, top):
        return {}
    h, heads = int(layer["hidden_size"]), int(layer["num_attention_heads"])
    kv = int(layer.get("num_key_value_heads") or heads)
    hd = int(layer.get("head_dim") or h // heads)
    inter, vocab = int(layer["intermediate_size"]), int(layer["vocab_size"])
    th = int(top.get("target_hidden_size") or h)
    m = "midlayer."
    return {
        m + "self_attn.q_proj.weight": (heads * hd, 2 * h), m + "self_attn.k_proj.weight": (kv * hd, 2 * h),
        m + "self_attn.v_proj.weight": (kv * hd, 2 * h), m + "self_attn.o_proj.weight": (h, heads * hd),
        m + "mlp.gate_proj.weight": (inter, h), m + "mlp.up_proj.weight": (inter, h), m + "mlp.down_proj.weight": (h, inter),
        m + "input_layernorm.weight": (h,), m + "hidden_norm.weight": (h,), m + "post_attention_layernorm.weight": (h,),
        "norm.weight": (h,), "embed_tokens.weight": (vocab, h), "input_norm.weight": (n_aux * th,),
        **{f"fc_norm.{i}.weight": (th,) for i in range(n_aux)},
    }


def tensor_problems(tensors: Mapping[str, tuple[tuple[int, ...], str]], known: set[str],
                    shapes: Mapping[str, tuple[int, ...]]) -> list[str]:
    """Return what is wrong with an export's tensors, given as {toolkit name: (shape, safetensors dtype)}:
    names no EAGLE-3 draft has (`known` is every name one may have), dtypes, and the `shapes` the config implies."""
    problems = []
    unexpected = sorted(set(tensors) - known)
    if unexpected:
        problems.append(f"tensors no EAGLE-3 draft has: {', '.join(unexpected[:5])}"
                        + (f" and {len(unexpected) - 5} more" if len(unexpected) > 5 else "")
                        + " (neither the engines' draft nor eval's has a place for them)")
    wrong = []
    for name, (_, dtype) in sorted(tensors.items()):
        if name == "d2t":
            ok = dtype in INT_DTYPES
        elif name == "t2d":
            ok = dtype in INT_DTYPES or dtype == "BOOL"
        else:
            ok = dtype in FLOAT_DTYPES
        if not ok and name in known:
            wrong.append(f"{name} {dtype}")
    if wrong:
        problems.append(f"tensor dtypes no engine serves as trained: {', '.join(wrong[:5])}"
                        + (f" and {len(wrong) - 5} more" if len(wrong) > 5 else "")
                        + " (weights are floats, d2t an integer, t2d a mask; integer weights carry no scales)")
    misshaped = [f"{name} is {list(tensors[name][0])}, expected {list(shape)}"
                 for name, shape in shapes.items() if name in tensors and tuple(tensors[name][0]) != shape]
    if misshaped:
        problems.append(f"tensors that do not fit the config: {'; '.join(misshaped[:4])}"
                        + (f" and {len(misshaped) - 4} more" if len(misshaped) > 4 else ""))
    return problems


def _short(value: Any) -> str:
    """Return a config value for a message: its repr, cut short (a value may be 4,000 digits or deeply nested)."""
    try:
        text = repr(value)
    except (ValueError, RecursionError):  # an integer past the digit limit, a structure nested past recursion
        return f"<{type(value).__name__}>"
    return text if len(text) <= 40 else text[:37] + "..."
