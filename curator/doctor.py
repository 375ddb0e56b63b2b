"""Deployment checks for an exported EAGLE-3 draft: its layout, its fit with the target and the
data it was trained on, and the server command meant to serve it.

The costly failure this exists for: SGLang started with `--speculative-algorithm EAGLE` instead
of `EAGLE3` captures no aux layers and hands the draft the target's H-wide final states; the
draft applies `fc` only when the incoming width differs from its embedding width, so `fc` is
silently skipped, nothing crashes, and acceptance collapses to ~1. Every check here reads files
and flags; nothing is loaded onto a device.
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from safetensors import SafetensorError, safe_open

from curator.errors import ConfigError
from training.target_config import read_target_config

Status = Literal["ok", "warn", "error"]

SGLANG_ARCH = "LlamaForCausalLMEagle3"
SPECULATORS_ARCH = "Eagle3Speculator"
# Keys the one decoder layer of an EAGLE-3 draft carries, relative to its prefix
# (`midlayer.` in the SGLang layout, `layers.0.` in the speculators one).
DECODER_KEYS = (
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
    "input_layernorm.weight",
    "hidden_norm.weight",
    "post_attention_layernorm.weight",
)
FC_BYPASS = (
    "with {algo} the server captures no aux layers and hands the draft the target's final hidden "
    "state ({h} wide) instead of the 3 aux states ({h3} wide) it was trained on; the draft applies fc "
    "only when the incoming width differs from its embedding width, so fc is silently skipped, "
    "nothing crashes, and acceptance collapses to ~1 token per step"
)


@dataclass
class Check:
    """One line of the doctor's table: what was checked, ok/warn/error, and why."""

    name: str
    status: Status
    detail: str


@dataclass
class DraftLayout:
    """What an export directory holds: its format, config and tensor shapes (nothing loaded)."""

    path: Path
    fmt: Literal["sglang", "speculators", "unknown"]
    config: dict[str, Any]
    shapes: dict[str, tuple[int, ...]]

    @property
    def decoder_config(self) -> dict[str, Any]:
        """Return the config block that describes the draft's decoder layer."""
        if self.fmt == "speculators":
            return dict(self.config.get("transformer_layer_config") or {})
        return self.config

    @property
    def decoder_prefix(self) -> str:
        """Return the weight-name prefix of the draft's decoder layer."""
        return "layers.0." if self.fmt == "speculators" else "midlayer."

    @property
    def hidden_size(self) -> int | None:
        return _int_or_none(self.decoder_config.get("hidden_size"))

    @property
    def vocab_size(self) -> int | None:
        return _int_or_none(self.decoder_config.get("vocab_size"))

    @property
    def draft_vocab_size(self) -> int | None:
        return _int_or_none(self.config.get("draft_vocab_size"))

    @property
    def aux_layer_ids(self) -> list[int] | None:
        """Return the recorded aux layer ids (SGLang convention: inputs of layers), or None."""
        if self.fmt == "speculators":
            ids = self.config.get("eagle_aux_hidden_state_layer_ids")
        else:
            ids = (self.config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        return [int(i) for i in ids] if isinstance(ids, list) else None


@dataclass
class LaunchSpec:
    """The speculative-decoding settings read from a server launch command."""

    engine: Literal["sglang", "vllm"]
    argv: list[str]
    target: str | None = None
    algorithm: str | None = None
    draft_path: str | None = None
    steps: int | None = None
    topk: int | None = None
    num_draft_tokens: int | None = None
    short_flags: bool = False  # vLLM's --spec-method/--spec-model/--spec-tokens were used
    serves_export: bool = False  # `vllm serve EXPORT`: vLLM builds the speculative config from the export
    export_steps: int | None = None  # then: the export's own speculative_tokens
    user_config: dict[str, Any] = field(default_factory=dict)  # vLLM: --speculative-config as written
    problems: list[Check] = field(default_factory=list)


@dataclass
class DoctorReport:
    """All checks made, and the launch command that serves this draft correctly."""

    checks: list[Check]
    launch_command: str

    @property
    def errors(self) -> list[Check]:
        return [c for c in self.checks if c.status == "error"]

    @property
    def ok(self) -> bool:
        return not self.errors


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def read_draft(path: str | Path) -> DraftLayout:
    """Return the layout of an export directory (config.json + *.safetensors headers)."""
    root = Path(path)
    if not root.is_dir():
        raise ConfigError(f"draft directory {root} does not exist (give the output of `curator export`)")
    config_path = root / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{config_path} is missing: {root} is not an exported draft") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{config_path} is not valid JSON ({exc})") from None
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"no *.safetensors weights in {root}")
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as handle:
                for key in handle.keys():
                    shapes[key] = tuple(handle.get_slice(key).get_shape())
        except (OSError, SafetensorError) as exc:
            raise ConfigError(f"{file} is not a readable safetensors file ({exc}); was it copied completely?") from None
    archs = config.get("architectures") or []
    if SPECULATORS_ARCH in archs or config.get("speculators_model_type"):
        fmt: Literal["sglang", "speculators", "unknown"] = "speculators"
    elif SGLANG_ARCH in archs:
        fmt = "sglang"
    else:
        fmt = "unknown"
    return DraftLayout(path=root, fmt=fmt, config=config, shapes=shapes)


def check_layout(layout: DraftLayout) -> list[Check]:
    """Return checks of the export on its own: architecture, weight names and shapes, d2t/t2d."""
    checks: list[Check] = []
    archs = layout.config.get("architectures")
    if layout.fmt == "unknown":
        checks.append(Check("architecture", "error",
                            f"architectures={archs!r}: expected [{SGLANG_ARCH!r}] (SGLang) or "
                            f"[{SPECULATORS_ARCH!r}] (vLLM speculators); re-export the checkpoint"))
        return checks
    checks.append(Check("architecture", "ok", f"{archs[0] if archs else layout.fmt} ({layout.fmt} layout)"))
    if layout.fmt == "speculators" and layout.config.get("speculators_model_type") != "eagle3":
        checks.append(Check("speculators type", "error",
                            f"speculators_model_type={layout.config.get('speculators_model_type')!r}, expected 'eagle3'"))

    h, vocab, dvocab = layout.hidden_size, layout.vocab_size, layout.draft_vocab_size
    missing_cfg = [n for n, v in (("hidden_size", h), ("vocab_size", vocab), ("draft_vocab_size", dvocab)) if v is None]
    if missing_cfg:
        checks.append(Check("config fields", "error", f"config.json lacks {', '.join(missing_cfg)}"))
        return checks

    shapes = layout.shapes
    prefix = layout.decoder_prefix
    # d2t/t2d belong only to a draft vocabulary smaller than the target's (vLLM refuses them otherwise)
    maps = ["d2t", "t2d"] if layout.draft_vocab_size != layout.vocab_size else []
    wanted = ["fc.weight", "norm.weight", "lm_head.weight", *maps, *(prefix + k for k in DECODER_KEYS)]
    missing = [k for k in wanted if k not in shapes]
    other_prefix = "midlayer." if prefix == "layers.0." else "layers.0."
    if missing and any(k.startswith(other_prefix) for k in shapes):
        checks.append(Check("weight names", "error",
                            f"weights are under {other_prefix}* but the config says the {layout.fmt} layout "
                            f"({prefix}*); the server would skip them silently and run a random layer"))
    elif missing:
        checks.append(Check("weight names", "error", f"missing tensors: {', '.join(missing[:6])}"
                            + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")))
    else:
        checks.append(Check("weight names", "ok", f"fc, {prefix}*, norm, lm_head{', d2t, t2d' if maps else ''} present"))

    if layout.fmt == "speculators":
        verifier = str(((layout.config.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path") or "")
        if not _vllm_takes_verifier(verifier):
            checks.append(Check("verifier", "warn",
                                f"speculators_config.verifier.name_or_path is {verifier!r}; `vllm serve` needs a Hub "
                                "repository id there: re-export with curator export --verifier ORG/NAME"))
    if "embed_tokens.weight" in shapes and layout.fmt == "sglang":
        checks.append(Check("embeddings", "warn",
                            "embed_tokens.weight is in the export; SGLang replaces it with the target's "
                            "embedding, so it only costs disk"))

    fc = shapes.get("fc.weight")
    target_h = _int_or_none(layout.decoder_config.get("target_hidden_size")) or h
    if fc is not None:
        if len(fc) != 2 or fc[0] != h:
            checks.append(Check("fc shape", "error", f"fc.weight is {list(fc)}, expected [{h}, 3*target_hidden]"))
        elif fc[1] != 3 * target_h:
            hint = ("set target_hidden_size in config.json" if fc[1] % 3 == 0 and fc[1] // 3 != h
                    else "the fc does not fuse 3 aux layers")
            checks.append(Check("fc shape", "error",
                                f"fc.weight is {list(fc)} but the config implies [{h}, {3 * target_h}] "
                                f"(3 x {target_h}); the server builds fc from the config and will refuse or "
                                f"misread it ({hint})"))
        else:
            checks.append(Check("fc shape", "ok", f"[{fc[0]}, {fc[1]}] = [H, 3 x {target_h}]"))

    q = shapes.get(prefix + "self_attn.q_proj.weight")
    if q is not None and len(q) == 2 and q[1] != 2 * h:
        checks.append(Check("midlayer input", "error",
                            f"{prefix}self_attn.q_proj.weight takes {q[1]} inputs; an EAGLE-3 layer attends "
                            f"over [embedding; fused hidden] = 2 x {h} = {2 * h}"))

    head = shapes.get("lm_head.weight")
    if head is not None:
        if tuple(head) != (dvocab, h):
            checks.append(Check("lm_head shape", "error",
                                f"lm_head.weight is {list(head)}, expected [draft_vocab_size={dvocab}, {h}]"))
        else:
            checks.append(Check("lm_head shape", "ok", f"[{dvocab}, {h}]"))
    checks.extend(_check_vocab_maps(layout, dvocab, vocab))

    ids = layout.aux_layer_ids
    if ids is None:
        checks.append(Check("aux layer ids", "warn",
                            "config.json records no eagle_aux_hidden_state_layer_ids; the server falls back "
                            "to its default [2, N//2, N-3], which must be what the draft was trained on"))
    elif len(ids) != 3:
        checks.append(Check("aux layer ids", "error", f"{ids}: EAGLE-3 fuses exactly 3 layers"))
    elif len(set(ids)) != 3:
        checks.append(Check("aux layer ids", "error", f"{ids} repeats a layer"))
    return checks


def _check_vocab_maps(layout: DraftLayout, dvocab: int, vocab: int) -> list[Check]:
    """Return checks of d2t [draft_vocab] and t2d [target_vocab], shapes then contents."""
    d2t_shape, t2d_shape = layout.shapes.get("d2t"), layout.shapes.get("t2d")
    if d2t_shape is None or t2d_shape is None:
        return []
    problems = []
    if tuple(d2t_shape) != (dvocab,):
        problems.append(f"d2t is {list(d2t_shape)}, expected [draft_vocab_size={dvocab}]")
    if tuple(t2d_shape) != (vocab,):
        problems.append(f"t2d is {list(t2d_shape)}, expected [vocab_size={vocab}]")
    if problems:
        return [Check("d2t/t2d", "error", "; ".join(problems))]
    d2t, t2d = _load_tensors(layout.path, ("d2t", "t2d"))
    import torch

    target_ids = d2t.long() + torch.arange(dvocab)
    if target_ids.min() < 0 or target_ids.max() >= vocab:
        return [Check("d2t/t2d", "error", "d2t maps draft ids outside the target vocabulary (d2t[i] must be target_id - i)")]
    if target_ids.unique().numel() != dvocab:
        return [Check("d2t/t2d", "error", "d2t maps two draft ids to the same target id")]
    mask = t2d.bool()
    if int(mask.sum()) != dvocab or not bool(mask[target_ids].all()):
        return [Check("d2t/t2d", "warn", "t2d does not mark exactly the ids d2t maps to (SGLang ignores t2d; vLLM uses it)")]
    return [Check("d2t/t2d", "ok", f"{dvocab:,} draft ids -> distinct target ids of {vocab:,}")]


def _load_tensors(root: Path, names: tuple[str, ...]) -> list[Any]:
    found: dict[str, Any] = {}
    for file in sorted(root.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            for name in names:
                if name in handle.keys():
                    found[name] = handle.get_tensor(name)
    return [found[n] for n in names]


def check_target(layout: DraftLayout, target_config: dict[str, Any]) -> list[Check]:
    """Return checks that the draft fits the target: widths, heads, vocab, layer ids in depth."""
    checks: list[Check] = []
    th = _int_or_none(target_config.get("hidden_size"))
    tvocab = _int_or_none(target_config.get("vocab_size"))
    tlayers = _int_or_none(target_config.get("num_hidden_layers"))
    theads = _int_or_none(target_config.get("num_attention_heads"))
    h = layout.hidden_size
    if th is None or tvocab is None or tlayers is None:
        return [Check("target config", "error", "target config.json lacks hidden_size, vocab_size or num_hidden_layers")]

    fc = layout.shapes.get("fc.weight")
    if fc is not None and len(fc) == 2:
        if fc[1] != 3 * th:
            checks.append(Check("fc width vs target", "error",
                                f"fc takes {fc[1]} inputs but 3 x target hidden {th} = {3 * th}: this draft "
                                f"was trained for another target"))
        else:
            checks.append(Check("fc width vs target", "ok", f"{fc[1]} = 3 x {th}"))
    if h is not None:
        if h != th:
            checks.append(Check("hidden size", "error",
                                f"draft hidden {h} != target hidden {th}; the server gives the draft the "
                                f"target's embedding ({th} wide)"))
        else:
            checks.append(Check("hidden size", "ok", f"{h}"))
    heads = _int_or_none(layout.decoder_config.get("num_attention_heads"))
    if heads is not None and theads is not None:
        if heads != theads:
            checks.append(Check("attention heads", "warn",
                                f"draft has {heads} heads, target {theads}: legal, but drafts normally copy "
                                f"the target's attention shape"))
        else:
            checks.append(Check("attention heads", "ok", f"{heads}"))
    vocab = layout.vocab_size
    if vocab is not None:
        if vocab != tvocab:
            checks.append(Check("vocab size", "error",
                                f"draft vocab_size {vocab} != target {tvocab}: d2t/t2d index another tokenizer"))
        else:
            checks.append(Check("vocab size", "ok", f"{vocab:,}"))
    checks.extend(check_served_layers(layout, target_config))
    return checks


def check_served_layers(layout: DraftLayout, target_config: dict[str, Any]) -> list[Check]:
    """Return checks that the layers each engine will capture are the ones the draft was trained on.

    SGLang applies its per-class rule to `eagle_config.eagle_aux_hidden_state_layer_ids` and its
    model loop drops ids past the model (training.layers); vLLM reads the ids as layer inputs, from
    the top-level key first (both runners), else the V1 runner from eagle_config's ids and the V2
    runner (the default) from `eagle_config.layer_ids`.
    """
    from training.errors import ModelMismatchError
    from training.export import served_layer_inputs
    from training.layers import SGLANG_VERSION, sglang_rule, sglang_rule_verified, vllm_captured

    n = int(target_config["num_hidden_layers"])
    arch = (target_config.get("architectures") or [None])[0]
    trained = (layout.config.get("curator") or {}).get("aux_layer_inputs")
    checks: list[Check] = []
    try:
        sglang = served_layer_inputs(layout.config, target_config)
    except ModelMismatchError as exc:
        return [Check("aux layers served", "error", str(exc))]
    if layout.fmt == "sglang":
        rule = sglang_rule(arch) + ("" if sglang_rule_verified(arch) else ", assumed: class not read in SGLang's source")
        served = {f"SGLang {SGLANG_VERSION} ({arch}: {rule})": sglang}
        eagle = layout.config.get("eagle_config") or {}
        top = layout.config.get("eagle_aux_hidden_state_layer_ids")
        v1 = top or eagle.get("eagle_aux_hidden_state_layer_ids")
        v2 = top or eagle.get("layer_ids")
        served["vLLM 0.33 V1 runner"] = vllm_captured(v1, n)
        served["vLLM 0.33 V2 runner"] = vllm_captured(v2, n)
    else:
        served = {"vLLM 0.33 / speculators": sglang}
    expected = sorted(int(i) for i in trained) if trained else None
    for engine, layers in served.items():
        short = "SGLang" if engine.startswith("SGLang") else "vLLM"
        if len(layers) != 3 or any(not 0 <= i <= n for i in layers):
            checks.append(Check(f"aux layers ({short})", "error",
                                f"{engine} captures the inputs of layers {layers} of a {n}-layer target: "
                                "ids past the model are never captured and the draft gets a narrower fc input"))
        elif expected is not None and layers != expected:
            checks.append(Check(f"aux layers ({short})", "error" if short == "SGLang" or layout.fmt != "sglang" else "warn",
                                f"{engine} feeds the draft the inputs of layers {layers}, but it was trained on "
                                f"{expected}: re-export with curator export"))
        else:
            checks.append(Check(f"aux layers ({short})", "ok", f"{engine} feeds the inputs of layers {layers}"
                                + (", as trained" if expected is not None else " (training layers not recorded)")))
    # one line per engine: the worst runner of vLLM stands for it
    merged: dict[str, Check] = {}
    rank = {"ok": 0, "warn": 1, "error": 2}
    for c in checks:
        if c.name not in merged or rank[c.status] > rank[merged[c.name].status]:
            merged[c.name] = c
    return list(merged.values())


def check_store(layout: DraftLayout, store_meta: Any, target_config: dict[str, Any] | None = None) -> list[Check]:
    """Return checks that the layers the engine will feed the draft are those its data was captured at."""
    from training.errors import ModelMismatchError
    from training.export import served_layer_inputs

    checks: list[Check] = []
    ids = list(store_meta.aux_layer_ids)  # inputs of layers, whatever the store recorded
    arch = (layout.config.get("curator") or {}).get("target_architecture")
    target = target_config or {"num_hidden_layers": store_meta.num_layers, "architectures": [arch]}
    try:
        served = served_layer_inputs(layout.config, target)
    except ModelMismatchError as exc:
        return [Check("layer ids vs data", "error", str(exc))]
    if served != ids:
        written = layout.aux_layer_ids
        how = (f"the export writes {written}, which the engine reads as" if written is not None
               else "the export writes no layer ids, so the engine uses its default,")
        checks.append(Check("layer ids vs data", "error",
                            f"{how} inputs of layers {served}, but the draft learned from {ids}: the server "
                            "would feed the draft other layers than it learned; re-export with curator export"))
    else:
        checks.append(Check("layer ids vs data", "ok", f"the engine feeds inputs of layers {ids}, as captured"))
    fc = layout.shapes.get("fc.weight")
    if fc is not None and len(fc) == 2 and fc[1] != 3 * int(store_meta.hidden_size):
        checks.append(Check("fc width vs data", "error",
                            f"fc takes {fc[1]} inputs but the data's aux states are 3 x {store_meta.hidden_size}"))
    if layout.vocab_size is not None and int(store_meta.vocab_size) != layout.vocab_size:
        checks.append(Check("vocab vs data", "error",
                            f"data was captured from a target with vocab {store_meta.vocab_size}, draft says {layout.vocab_size}"))
    return checks


# ---------------------------------------------------------------- launch commands

_SGLANG_FLAGS = {
    "model": ("--model-path", "--model"),
    "algorithm": ("--speculative-algorithm", "--speculative-algo"),
    "draft_path": ("--speculative-draft-model-path", "--speculative-draft-model"),
    "steps": ("--speculative-num-steps",),
    "topk": ("--speculative-eagle-topk",),
    "num_draft_tokens": ("--speculative-num-draft-tokens",),
}


def _options(argv: list[str]) -> tuple[list[tuple[str, str, str | None]], list[str]]:
    """Return the options in order as (as written, normalised, value or None) and the positionals.

    Names are normalised to dashes (vLLM accepts underscores too); `-x` short options count as
    options, except python's own `-m`, whose module name is a positional.
    """
    opts: list[tuple[str, str, str | None]] = []
    positionals: list[str] = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        is_option = tok.startswith("--") or (tok.startswith("-") and tok[1:2].isalpha() and tok != "-m")
        if not is_option:
            positionals.append(tok)
            i += 1
            continue
        written, eq, value = tok.partition("=")
        norm = written[:2] + written[2:].replace("_", "-") if written.startswith("--") else written
        if eq:
            opts.append((written, norm, value))
        elif i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            opts.append((written, norm, argv[i + 1]))
            i += 1
        else:
            opts.append((written, norm, None))
        i += 1
    return opts, positionals


def _option_map(argv: list[str]) -> tuple[dict[str, str | None], list[str]]:
    """Return {normalised flag: value} (the last one wins, as in argparse) and the positionals."""
    opts, positionals = _options(argv)
    return {norm: value for _, norm, value in opts}, positionals


def _int_opt(spec: LaunchSpec, flag: str, value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        spec.problems.append(Check(flag, "error", f"{flag} {value!r} is not an integer"))
        return None


def parse_launch(command: str) -> LaunchSpec:
    """Return the speculative settings of an SGLang or vLLM launch command."""
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise ConfigError(f"cannot parse the launch command ({exc})") from None
    # Leading VAR=value assignments (CUDA_VISIBLE_DEVICES=0 ...) are the shell's, not the server's.
    while argv and "=" in argv[0] and not argv[0].startswith("-"):
        argv = argv[1:]
    joined = " ".join(argv)
    if "sglang.launch_server" in joined or (len(argv) > 1 and argv[0].endswith("sglang") and argv[1] == "serve"):
        return _parse_sglang(argv)
    if "vllm.entrypoints" in joined or (len(argv) > 1 and argv[0].endswith("vllm") and argv[1] == "serve"):
        return _parse_vllm(argv)
    raise ConfigError("the launch command is neither `python -m sglang.launch_server ...` nor `vllm serve ...`")


def _parse_sglang(argv: list[str]) -> LaunchSpec:
    opts, _ = _option_map(argv)
    spec = LaunchSpec(engine="sglang", argv=argv)

    def first(key: str) -> str | None:
        return next((opts[f] for f in _SGLANG_FLAGS[key] if f in opts), None)

    spec.target = first("model")
    spec.algorithm = first("algorithm")
    spec.draft_path = first("draft_path")
    spec.steps = _int_opt(spec, "--speculative-num-steps", first("steps"))
    spec.topk = _int_opt(spec, "--speculative-eagle-topk", first("topk"))
    spec.num_draft_tokens = _int_opt(spec, "--speculative-num-draft-tokens", first("num_draft_tokens"))
    return spec


# vLLM 0.33 (engine/arg_utils.py): `--speculative-config`/`-sc` takes JSON; `--spec-method`,
# `--spec-model` and `--spec-tokens` fill its keys and are refused when the JSON sets the same key.
_VLLM_SHORT = {"--spec-method": "method", "--spec-model": "model", "--spec-tokens": "num_speculative_tokens"}


def _parse_vllm(argv: list[str]) -> LaunchSpec:
    opts, positionals = _option_map(argv)
    spec = LaunchSpec(engine="vllm", argv=argv)
    after_serve = positionals[positionals.index("serve") + 1:] if "serve" in positionals else []
    spec.target = opts.get("--model") or (after_serve[0] if after_serve else None)
    if "--speculative-model" in opts or "--num-speculative-tokens" in opts:
        spec.problems.append(Check("speculative config", "error",
                                   "--speculative-model/--num-speculative-tokens were removed from vLLM; use "
                                   "--spec-model/--spec-tokens or --speculative-config '{\"method\": \"eagle3\", ...}'"))
    raw = opts.get("--speculative-config", opts.get("-sc"))
    config: dict[str, Any] = {}
    if raw is not None:
        try:
            parsed = json.loads(raw or "")
        except json.JSONDecodeError as exc:
            spec.problems.append(Check("speculative config", "error", f"--speculative-config is not JSON ({exc})"))
            return spec
        if not isinstance(parsed, dict):
            spec.problems.append(Check("speculative config", "error", "--speculative-config must be a JSON object"))
            return spec
        config = {k.replace("-", "_"): v for k, v in parsed.items()}
        spec.user_config = dict(config)
    for flag, key in _VLLM_SHORT.items():
        if flag not in opts:
            continue
        spec.short_flags = True
        if key in config:
            spec.problems.append(Check("speculative config", "error",
                                       f"{flag} and --speculative-config['{key}'] are mutually exclusive: vLLM refuses "
                                       "to start; give each setting once"))
        config[key] = opts[flag]
    if not config and "--speculative-model" in opts:
        spec.draft_path = opts.get("--speculative-model")
        return spec
    if not config:
        return spec
    spec.algorithm = config.get("method")
    spec.draft_path = config.get("model")
    tokens = config.get("num_speculative_tokens")
    spec.steps = _int_opt(spec, "num_speculative_tokens", None if tokens is None else str(tokens))
    spec.topk = 1
    spec.num_draft_tokens = spec.steps + 1 if spec.steps is not None else None
    return spec


def _same_path(given: str, expected: str | Path) -> Status:
    """Return ok when both name the same directory, warn when only the last part matches."""
    try:
        if Path(given).exists() and os.path.samefile(given, expected):
            return "ok"
    except OSError:
        pass
    if os.path.normpath(given) == os.path.normpath(str(expected)):
        return "ok"
    if Path(given.rstrip("/")).name == Path(str(expected).rstrip("/")).name:
        return "warn"
    return "error"


def check_launch(spec: LaunchSpec, layout: DraftLayout, target: str | Path | None = None,
                 target_hidden: int | None = None) -> list[Check]:
    """Return checks of a launch command against this draft (algorithm, path, step settings)."""
    checks = list(spec.problems)
    h = target_hidden or layout.hidden_size or 0
    if spec.engine == "sglang" and layout.fmt == "speculators":
        checks.append(Check("layout vs server", "error",
                            "SGLang picks the draft's class from config.json `architectures` and has no "
                            "Eagle3Speculator class (nor reads transformer_layer_config), so it fails at start-up: "
                            "export with --format sglang"))
    # `vllm serve EXPORT` serves the verifier the export names (transformers_utils/config.py,
    # maybe_override_with_speculators); with the target given and the draft in the speculative
    # config, the verifier is not read
    serves_export = spec.target is not None and _same_path(spec.target, layout.path) == "ok"
    if spec.engine == "vllm" and layout.fmt == "speculators" and serves_export:
        checks.extend(_resolve_served_export(spec, layout, target))
    algo = (spec.algorithm or "").upper()
    if spec.engine == "vllm" and layout.fmt == "sglang" and layout.config.get("eagle_aux_hidden_state_layer_ids") is None:
        checks.append(Check("layout vs server", "error",
                            "vLLM serves this layout as Eagle3LlamaForCausalLM but reads its layer ids from the "
                            "top-level eagle_aux_hidden_state_layer_ids (then, per runner, eagle_config's ids as layer "
                            "inputs or eagle_config.layer_ids), which this export lacks: re-export with curator export"))
    if spec.algorithm is None:
        if spec.engine == "vllm" and layout.fmt == "speculators" and spec.draft_path:
            checks.append(Check("algorithm", "warn", "no \"method\": vLLM reads eagle3 from the speculators config; say it explicitly"))
        else:
            where = "--speculative-algorithm EAGLE3" if spec.engine == "sglang" else '"method": "eagle3"'
            checks.append(Check("algorithm", "error", f"no speculative algorithm given: add {where}"))
    elif algo == "EAGLE3":
        checks.append(Check("algorithm", "ok", spec.algorithm))
    elif algo == "EAGLE":
        checks.append(Check("algorithm", "error",
                            f"{spec.algorithm} instead of EAGLE3: " + FC_BYPASS.format(algo=spec.algorithm, h=h, h3=3 * h)))
    else:
        checks.append(Check("algorithm", "error", f"{spec.algorithm} does not run an EAGLE-3 draft; use EAGLE3"))

    if spec.draft_path is None:
        checks.append(Check("draft path", "error", "no draft model path in the command"))
    else:
        status = _same_path(spec.draft_path, layout.path)
        detail = {"ok": spec.draft_path,
                  "warn": f"{spec.draft_path} has this export's name but another path: make sure it is a copy of {layout.path}",
                  "error": f"{spec.draft_path} is not this draft ({layout.path})"}[status]
        checks.append(Check("draft path", status, detail))

    if target is not None and not spec.serves_export:
        if spec.target is None:
            checks.append(Check("target model", "error", "the command names no target model"))
        else:
            status = _same_path(spec.target, target)
            detail = {"ok": spec.target,
                      "warn": f"{spec.target} has the target's name but another path than {target}",
                      "error": f"the command serves {spec.target}, but the draft was checked against {target}"}[status]
            checks.append(Check("target model", status, detail))
    checks.extend(_check_step_settings(spec))
    return checks


def _resolve_served_export(spec: LaunchSpec, layout: DraftLayout, target: str | Path | None) -> list[Check]:
    """Fill `spec` with what vLLM makes of `vllm serve EXPORT`, and return the checks of that form.

    vLLM 0.33 (transformers_utils/config.py `maybe_override_with_speculators`, configs/speculators/
    base.py) reads the export's config.json: the method is `speculators_model_type` and the draft
    is the export, whatever --speculative-config says (both are locked); num_speculative_tokens is
    `proposal_methods[0].speculative_tokens` unless --speculative-config sets it; the served model
    and tokenizer become `verifier.name_or_path`, which must be a Hub repository id and not a
    local path. It refuses a config without proposal_methods, speculative_tokens or
    transformer_layer_config.
    """
    checks: list[Check] = []
    spec.serves_export = True
    if spec.short_flags:
        checks.append(Check("speculative config", "error",
                            "`vllm serve EXPORT` fills method, model and num_speculative_tokens from the export, and "
                            "vLLM then refuses --spec-method/--spec-model/--spec-tokens as set twice: drop them (a "
                            "token count goes in --speculative-config '{\"num_speculative_tokens\": N}')"))
    if "--tokenizer" in _option_map(spec.argv)[0]:
        checks.append(Check("tokenizer", "warn", "--tokenizer is ignored: vLLM serves the verifier's tokenizer"))
    config = layout.config
    sconf = config.get("speculators_config") if isinstance(config.get("speculators_config"), dict) else {}
    methods = sconf.get("proposal_methods")
    first = methods[0] if isinstance(methods, list) and methods and isinstance(methods[0], dict) else {}
    tokens = spec.export_steps = _int_or_none(first.get("speculative_tokens"))
    if tokens is None or not isinstance(config.get("transformer_layer_config"), dict):
        checks.append(Check("speculators config", "error",
                            "vLLM refuses this export at start-up: its config.json needs speculators_config."
                            "proposal_methods[0].speculative_tokens and a transformer_layer_config; re-export it"))
    method = config.get("speculators_model_type")
    if spec.algorithm is not None and str(spec.algorithm).lower() != str(method).lower():
        checks.append(Check("speculative config", "warn",
                            f"method {spec.algorithm!r} is ignored: vLLM takes {method!r} from the export"))
    if spec.draft_path is not None and _same_path(spec.draft_path, layout.path) != "ok":
        checks.append(Check("speculative config", "warn",
                            f"model {spec.draft_path!r} is ignored: vLLM drafts with the export it serves"))
    spec.algorithm, spec.draft_path = (str(method) if method else None), str(layout.path)
    if spec.steps is None and tokens is not None:
        spec.steps, spec.topk, spec.num_draft_tokens = tokens, 1, tokens + 1

    verifier = str((sconf.get("verifier") or {}).get("name_or_path") or "")
    if not _vllm_takes_verifier(verifier):
        checks.append(Check("verifier", "error",
                            f"`vllm serve` on the export serves its verifier, {verifier!r}: not a Hub repository "
                            "id (or a local path too), which vLLM refuses; re-export with curator export "
                            "--verifier ORG/NAME, or serve the target with --speculative-config"))
        return checks
    spec.target = verifier
    checks.append(Check("launch form", "ok",
                        f"`vllm serve EXPORT`: vLLM serves the verifier {verifier} with this draft "
                        f"({method}, {spec.steps} tokens per step)"))
    if target is not None:
        same_name = Path(str(target).rstrip("/")).name.lower() == verifier.rsplit("/", 1)[-1].lower()
        checks.append(Check("target model", "warn",
                            f"vLLM downloads the verifier {verifier} from the Hub; the draft was checked against "
                            f"{target}" + ("" if same_name else ", whose folder name differs")
                            + ": make sure they are the same model and revision"))
    return checks


def _vllm_takes_verifier(name: str) -> bool:
    """Return whether vLLM 0.33 accepts `name` as a speculators verifier: a valid Hub repository id
    (huggingface_hub's own `validate_repo_id`, which vLLM calls; bare ids like "gpt2" pass) that is
    not also a local path."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return not (Path(name).exists() or Path(name).is_symlink())


def _check_step_settings(spec: LaunchSpec) -> list[Check]:
    if spec.engine == "vllm":
        if spec.steps is None and spec.serves_export:
            return [Check("draft steps", "error", "the export's speculators_config names no speculative_tokens")]
        if spec.steps is None:
            return [Check("draft steps", "error", "num_speculative_tokens missing from --speculative-config")]
        if spec.steps < 1:
            return [Check("draft steps", "error", f"num_speculative_tokens={spec.steps} must be >= 1")]
        return [Check("draft steps", "ok", f"{spec.steps} tokens per step (chain)")]
    # SGLang 0.5.23 (srt/arg_groups/speculative_hook.py): without --speculative-num-steps it asserts
    # that topk and num_draft_tokens are unset too and picks all three per model; with topk 1 it
    # adjusts num_draft_tokens to steps + 1 (a warning in its log)
    steps, topk, ndt = spec.steps, spec.topk, spec.num_draft_tokens
    if steps is None and (topk is not None or ndt is not None):
        return [Check("draft steps", "error",
                      "--speculative-eagle-topk or --speculative-num-draft-tokens without --speculative-num-steps: "
                      "SGLang fails an assertion at start-up; give all three (or none)")]
    given = {"--speculative-num-steps": steps, "--speculative-eagle-topk": topk, "--speculative-num-draft-tokens": ndt}
    unset = [k for k, v in given.items() if v is None]
    if unset:
        return [Check("draft steps", "warn", f"{', '.join(unset)} not given: SGLang picks its own per model; "
                                             f"state them so the run measures what you meant")]
    assert steps is not None and topk is not None and ndt is not None
    if steps < 1 or topk < 1 or ndt < 2:
        return [Check("draft steps", "error", f"steps {steps}, topk {topk}, draft tokens {ndt}: need steps>=1, topk>=1, draft tokens>=2")]
    if topk == 1 and ndt != steps + 1:
        return [Check("draft steps", "warn",
                      f"with topk 1 the draft is a chain of {steps} tokens, verified with the root as {steps + 1}; "
                      f"SGLang adjusts --speculative-num-draft-tokens {ndt} to {steps + 1}: say {steps + 1}")]
    most = 1 + topk + (steps - 1) * topk * topk
    if ndt > most:
        return [Check("draft steps", "error",
                      f"a tree of {steps} steps with top-{topk} has at most {most} nodes incl. the root; "
                      f"--speculative-num-draft-tokens {ndt} is more")]
    return [Check("draft steps", "ok", f"steps {steps}, topk {topk}, draft tokens {ndt}")]


def suggested_launch(layout: DraftLayout, target: str | Path | None = None, spec: LaunchSpec | None = None) -> str:
    """Return a launch command that serves this draft correctly, keeping the user's other flags."""
    engine = spec.engine if spec else ("vllm" if layout.fmt == "speculators" else "sglang")
    # a `vllm serve EXPORT` that cannot resolve its verifier names the export, not a target
    model = str(target) if target is not None else (spec.target if spec and spec.target and not spec.serves_export else None)
    if model is None:
        verifier = (layout.config.get("speculators_config") or {}).get("verifier") or {}
        model = verifier.get("name_or_path") or "TARGET_MODEL_PATH"
    steps = spec.steps if spec and spec.steps and spec.steps >= 1 else 3
    topk = spec.topk if spec and spec.topk and spec.topk >= 1 else 1
    if spec and spec.num_draft_tokens and topk > 1 and 2 <= spec.num_draft_tokens <= 1 + topk + (steps - 1) * topk * topk:
        ndt = spec.num_draft_tokens
    else:
        ndt = steps + 1 if topk == 1 else min(1 + topk + (steps - 1) * topk * topk, 2 * steps + 2)
    draft = str(layout.path)
    if engine == "vllm" and spec is not None and spec.serves_export and spec.target != str(layout.path):
        # `vllm serve EXPORT` resolved to a Hub verifier: keep that form, with the user's own options
        kept = _kept_args(spec, {"--speculative-config", "-sc", "--model", "--tokenizer", *_VLLM_SHORT})
        # the user's other keys stay (vLLM merges them); method and model are the export's anyway
        own = {k: v for k, v in spec.user_config.items() if k not in ("method", "model")}
        if steps != spec.export_steps:
            own["num_speculative_tokens"] = steps
        return shlex.join(["vllm", "serve", draft, *kept, *(["--speculative-config", json.dumps(own)] if own else [])])
    if engine == "vllm":
        dropped = {"--speculative-config", "-sc", "--model", "--speculative-model", "--num-speculative-tokens", *_VLLM_SHORT}
        kept = _kept_args(spec, dropped) if spec else []
        if spec is not None and spec.short_flags:
            return shlex.join(["vllm", "serve", model, *kept, "--spec-method", "eagle3", "--spec-model", draft,
                               "--spec-tokens", str(steps)])
        config = json.dumps({"method": "eagle3", "model": draft, "num_speculative_tokens": steps})
        return shlex.join(["vllm", "serve", model, *kept, "--speculative-config", config])
    dropped = {f for names in _SGLANG_FLAGS.values() for f in names}
    kept = _kept_args(spec, dropped) if spec else []
    return shlex.join(["python", "-m", "sglang.launch_server", "--model-path", model, *kept,
                       "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", draft,
                       "--speculative-num-steps", str(steps), "--speculative-eagle-topk", str(topk),
                       "--speculative-num-draft-tokens", str(ndt)])


def _kept_args(spec: LaunchSpec, dropped: set[str]) -> list[str]:
    """Return the user's own options (everything but the ones we rewrite), as written, in order."""
    opts, _ = _options(spec.argv)
    kept: list[str] = []
    for written, norm, value in opts:
        if norm in dropped:
            continue
        kept.append(written)
        if value is not None:
            kept.append(value)
    return kept


def diagnose(draft: str | Path, target: str | Path | None = None, store: str | Path | None = None,
             launch: str | None = None) -> DoctorReport:
    """Return every check on a draft export, optionally against its target, data and launch command."""
    layout = read_draft(draft)
    checks = check_layout(layout)
    target_hidden = None
    if target is not None:
        target_config = read_target_config(target)
        target_hidden = _int_or_none(target_config.get("hidden_size"))
        checks.extend(check_target(layout, target_config))
    if store is not None:
        from training.errors import StoreError
        from training.store import HiddenStateStore

        try:
            meta = HiddenStateStore.open(store).meta
        except StoreError as exc:
            raise ConfigError(f"cannot read the hidden-state store {store}: {exc}") from None
        checks.extend(check_store(layout, meta, read_target_config(target) if target is not None else None))
    spec = parse_launch(launch) if launch is not None else None
    if spec is not None:
        checks.extend(check_launch(spec, layout, target, target_hidden))
    return DoctorReport(checks=checks, launch_command=suggested_launch(layout, target, spec))
