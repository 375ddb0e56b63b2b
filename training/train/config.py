"""The training run's config: one dataclass holding every option, read from JSON (or YAML when
PyYAML is installed, through training.io.safe_yaml: no aliases), so that a run is reproducible from
the file that names it."""

from __future__ import annotations

import dataclasses
import math
import json
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.errors import ConfigFileError, TrainingError
from training.io.config_file import read_config


@dataclass
class TrainConfig:
    # where things are
    data: str = ""  # hidden-state store directory; with online: a generation output directory
    online: bool = False  # run the target beside the draft (training/capture/online.py): nothing is stored
    # engine-fed (training/feed/engine.py, docs/engine-fed.md): vLLM servers running extract_hidden_states
    # capture each sample's states just before its step; data is a generation output directory
    engine: str = ""  # comma-separated endpoint URLs; empty: not engine-fed
    engine_model: str = ""  # the name the engines serve the target under (default: target)
    engine_shared_dir: str = ""  # the engines' shared_storage_path, as they name it
    engine_path_map: str = ""  # ENGINE_DIR=LOCAL_DIR when the shared folder is mounted elsewhere here
    engine_concurrency: int = 4  # requests in flight per engine
    engine_retries: int = 4
    engine_timeout_s: float = 600.0
    prefetch_samples: int = 64  # captured samples held ahead of the step, per rank
    prefetch_bytes: str | int = ""  # and at most this many bytes of them (e.g. 8GB); empty: no byte bound
    cache_budget: str | int = "0"  # keep captured samples on local disk up to this (e.g. 500GB) for later epochs; 0: recapture every epoch
    cache_dir: str = ""  # where the cache goes (default: out/engine-cache)
    target: str = ""  # the target's local model directory (config.json + safetensors)
    out: str = ""  # run directory: checkpoints, metrics.jsonl, vocab.json
    # the draft
    draft_kind: str = "eagle3"  # a registered draft kind (training/drafts/registry.py); the options below are EAGLE-3's
    draft_vocab_size: int = 32000
    intermediate_size: int | None = None  # None: the target's
    init_lm_head_from_target: bool = True
    # EAGLE-3.1's normalisations (training/eagle3/model.py; docs/eagle3-variants.md): all off is plain EAGLE-3
    norm_before_fc: bool = False  # one RMSNorm over the concatenated aux states before fc
    fc_norm: bool = False  # one RMSNorm per aux state before fc (exclusive with norm_before_fc)
    norm_before_residual: bool = False  # the midlayer's residual is the normed hidden (SGLang 0.5.23 ignores it)
    norm_output: bool = False  # the next step is fed the post-norm hidden
    init_from: str = ""  # start from an exported EAGLE-3/3.1 draft (either layout): its weights, vocabulary and norms
    vocab_max_samples: int | None = None  # count the draft vocab over at most this many train samples
    # training-time test and loss
    ttt_steps: int = 7
    step_weight: float = 0.8  # loss weight of TTT step k is step_weight ** k
    # optimisation (SpecForge's defaults)
    lr: float = 1e-4
    min_lr_ratio: float = 0.0
    warmup_ratio: float = 0.015
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 0.5
    # data
    max_length: int = 2048
    global_batch_size: int = 8  # sequences per optimizer step, over all ranks
    micro_batch_size: int = 2  # sequences per forward on one rank (gradient accumulation covers the rest)
    bucket_batches: int = 16  # length-sort windows of this many global batches (less padding)
    epochs: float = 1.0
    max_steps: int | None = None  # overrides epochs
    eval_fraction: float = 0.05
    eval_data: str = ""  # a separate store of held-out samples; when set, the whole --data store trains
    max_train_samples: int | None = None  # use only the first N training ids (nested pools for scaling curves)
    eval_max_samples: int | None = 512
    # bookkeeping
    log_every: int = 10
    eval_every: int = 0  # 0: at the end only
    save_every: int = 0  # 0: at the end only
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    bf16: bool | None = None  # None: on when training on CUDA

    def __post_init__(self) -> None:
        problems = []
        if self.ttt_steps < 1:
            problems.append("ttt_steps must be >= 1")
        if self.global_batch_size < 1 or self.micro_batch_size < 1:
            problems.append("global_batch_size and micro_batch_size must be >= 1")
        if self.norm_before_fc and self.fc_norm:
            problems.append("norm_before_fc and fc_norm are exclusive (one norm over the concatenated aux states, "
                            "or one per state)")
        if not 0.0 <= self.eval_fraction < 1.0:
            problems.append("eval_fraction must be in [0, 1)")
        if self.max_length < 2:
            problems.append("max_length must be >= 2")
        # the optimizer's own ValueErrors ("Invalid learning rate") would come unnamed, mid-setup
        for name in ("lr", "min_lr_ratio", "warmup_ratio", "weight_decay", "grad_clip", "step_weight", "epochs"):
            value = getattr(self, name)
            if isinstance(value, (int, float)) and not (math.isfinite(value) and value >= 0):
                problems.append(f"{name} must be a finite number >= 0, not {value!r}")
        for name in ("beta1", "beta2"):
            value = getattr(self, name)
            if isinstance(value, (int, float)) and not 0.0 <= value < 1.0:
                problems.append(f"{name} must be in [0, 1), not {value!r}")
        if self.engine and self.online:
            problems.append("engine and online are two sources of states: set one")
        if self.prefetch_samples < 1 or self.engine_concurrency < 1 or self.engine_retries < 0:
            problems.append("prefetch_samples and engine_concurrency must be >= 1, engine_retries >= 0")
        if problems:
            raise TrainingError("invalid training config: " + "; ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        """Return the config as a JSON-ready dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """Return a config from a dict; unknown keys and values of the wrong type are refused."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise TrainingError(f"unknown training config keys: {unknown} (known: {sorted(fields)})")
        hints = typing.get_type_hints(cls)
        return cls(**{k: _coerce(k, v, hints[k]) for k, v in data.items()})

    def replace(self, **overrides: Any) -> TrainConfig:
        """Return a copy with the non-None `overrides` applied (CLI flags over the file)."""
        return TrainConfig.from_dict({**self.to_dict(), **{k: v for k, v in overrides.items() if v is not None}})


def _coerce(name: str, value: Any, hint: Any) -> Any:
    """Return `value` as the field's type (int/float/bool/str, optionally None); refuse others."""
    allowed = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if value is None:
        if type(None) in allowed:
            return None
        raise TrainingError(f"training config {name!r} may not be null")
    for t in allowed:
        if t is bool and isinstance(value, bool):
            return value
        if t is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if t is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if t is str and isinstance(value, (str, Path)):
            return str(value)
    wanted = " or ".join(getattr(t, "__name__", str(t)) for t in allowed)
    raise TrainingError(f"training config {name!r} must be {wanted}, got {_excerpt(value)}")


def _excerpt(value: Any, limit: int = 80) -> str:
    """Return the start of `value`'s repr: an error names a value without copying a huge one into the message."""
    if isinstance(value, (dict, list)):
        return f"a {type(value).__name__} of {len(value)} items"
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Return the mapping in a JSON or YAML config file (YAML needs PyYAML)."""
    p = Path(path)
    data = read_config(p)  # YAML for .yaml and .yml (PyYAML may be missing on a GPU node), else JSON
    if not isinstance(data, dict):
        raise ConfigFileError(f"{p} must hold a mapping of option: value")
    return data


REQUIRED = ("data", "target", "out")


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """Return `key=value` command-line items as a dict; values are read as JSON, else kept as text.

    `lr=3e-4` is a float, `max_steps=null` is None, `online=true` a bool, `out=runs/d1` a string.
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise TrainingError(f"{item!r} is not key=value (e.g. max_steps=600)")
        try:
            out[key.strip()] = json.loads(value)
        except (ValueError, RecursionError):  # not JSON (or past json's limits): kept as text
            out[key.strip()] = value
    return out


def load_run_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] | dict[str, Any] = ()) -> TrainConfig:
    """Return a run's config: the file's options (JSON or YAML), then `key=value` overrides over them.

    Both entry points (`curator train` and `python -m training.trainer`, under torchrun or not)
    read a run this way, and the run directory keeps the result as train_config.json.
    """
    data = read_config_file(path) if path else {}
    extra = parse_overrides(list(overrides)) if not isinstance(overrides, dict) else dict(overrides)
    cfg = TrainConfig.from_dict({**data, **extra})
    missing = [name for name in REQUIRED if not getattr(cfg, name)]
    if missing:
        raise TrainingError(f"set {', '.join(missing)} in the config file or as key=value (e.g. {missing[0]}=...)")
    return cfg
