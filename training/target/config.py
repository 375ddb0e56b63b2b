"""The target's config.json: the one reader every stage uses.

Multimodal and composite models keep their language model's widths in a nested block: Kimi-K2.5
and Qwen-VL under `text_config`, InternVL-style models under `llm_config`, others under
`language_config`. Every stage needs the language model's hidden size, depth and vocabulary,
plus the outer `architectures` (which class an engine builds, hence its layer-id rule), so the
reader flattens the nested block and keeps the outer fields that describe the whole model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from training.errors import TrainingError
from training.io.jsonfile import JSONFileError, read_json

NESTED_KEYS = ("text_config", "language_config", "llm_config")
OUTER_KEYS = ("architectures", "_name_or_path", "tie_word_embeddings", "torch_dtype")
REQUIRED = ("hidden_size", "num_hidden_layers")


def text_part(cfg: dict[str, Any]) -> dict[str, Any]:
    """Return the language model's config from a (possibly composite) config dict, outer fields kept."""
    if "hidden_size" in cfg:
        return cfg
    for key in NESTED_KEYS:
        inner = cfg.get(key)
        if isinstance(inner, dict) and "hidden_size" in inner:
            merged = dict(inner)
            for outer in OUTER_KEYS:
                if cfg.get(outer) is not None:
                    merged[outer] = cfg[outer]
            return merged
    return cfg


def config_path(source: str | Path) -> Path:
    """Return the config file for a model directory, its config.json, or a config dict file."""
    path = Path(source)
    return path / "config.json" if path.is_dir() else path


def read_target_config(source: str | Path, required: tuple[str, ...] = REQUIRED) -> dict[str, Any]:
    """Return the target's language-model config, from a model directory or a config file.

    Raises a TrainingError that says what to pass when the file is missing, not JSON, or lacks
    the `required` widths (by default those every stage that shapes a draft or a store needs).
    """
    path = config_path(source)
    try:
        cfg = read_json(path)
    except FileNotFoundError as exc:
        raise TrainingError(f"{source}: no config.json; pass the target's local model directory or its config.json") from exc
    except (OSError, JSONFileError) as exc:  # JSONFileError: also a 5,000-digit integer or nesting 100K deep
        raise TrainingError(f"{path} is not a readable JSON config ({exc})") from None
    if not isinstance(cfg, dict):
        raise TrainingError(f"{path} is not a config dict")
    text = text_part(cfg)
    missing = [k for k in required if not isinstance(text.get(k), int)]
    if missing:
        raise TrainingError(f"{path} lacks {', '.join(missing)} (also under {', '.join(NESTED_KEYS)}); "
                            "is it a transformer model's config.json?")
    return text


def is_hub_id(name: str) -> bool:
    """Return whether `name` reads as a Hub repository id (org/name), not a local path."""
    return name.count("/") == 1 and not name.startswith((".", "/", "~")) and not Path(name).exists()
