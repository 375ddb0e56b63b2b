"""An exported draft folder, of any kind and layout: a Hugging Face model folder, which is what every
engine reads. Its two files' names, its config.json read back, and the toolkit's record in it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from training.errors import TrainingError
from training.io.jsonfile import JSONFileError, read_json

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
PROVENANCE_KEY = "curator"  # the toolkit's record in an exported config: how the draft was trained


def read_export_config(export_dir: str | Path) -> dict[str, Any]:
    """Return an export's config.json as a dict; TrainingError when it is missing or not a JSON object."""
    root = Path(export_dir)
    try:
        config = read_json(root / CONFIG_FILE)
    except (OSError, JSONFileError) as exc:  # JSONFileError: also a 5,000-digit integer or nesting 100K deep
        raise TrainingError(f"{root} is not an exported draft ({exc})") from None
    if not isinstance(config, dict):
        raise TrainingError(f"{root}/config.json is not a JSON object; re-export the draft with curator export")
    return config


def provenance(config: dict[str, Any]) -> dict[str, Any]:
    """Return the toolkit's record in an exported config; {} for a draft from elsewhere (or a record that is not an object)."""
    block = config.get(PROVENANCE_KEY)
    return block if isinstance(block, dict) else {}
