"""An exported draft read once: its layout, config and tensor shapes, as the doctor, eval and the
engines' launch checks see it. Nothing is loaded onto a device; only the safetensors headers are read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open

from curator.engines.launch import int_or_none
from curator.errors import ConfigError
from training.drafts.registry import layout_of_export
from training.eagle3.layouts.base import Layout
from training.io.export_folder import provenance
from training.io.jsonfile import JSONFileError, read_json


@dataclass
class DraftLayout:
    """What an export directory holds: its layout (None: not one the toolkit knows), config and tensor shapes."""

    path: Path
    layout: Layout | None
    config: dict[str, Any]
    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, str] = field(default_factory=dict)  # safetensors header dtypes ("BF16", "I64", "BOOL")

    @property
    def fmt(self) -> str:
        return self.layout.name if self.layout else "unknown"

    @property
    def decoder_config(self) -> dict[str, Any]:
        """Return the config block that describes the draft's decoder layer."""
        return self.layout.decoder_config(self.config) if self.layout else {}

    @property
    def tensors(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """Return {file name: (shape, safetensors dtype)}, what Layout.tensor_problems judges."""
        return {k: (shape, self.dtypes.get(k, "")) for k, shape in self.shapes.items()}

    @property
    def hidden_size(self) -> int | None:
        return int_or_none(self.decoder_config.get("hidden_size"))

    @property
    def vocab_size(self) -> int | None:
        return int_or_none(self.decoder_config.get("vocab_size"))

    @property
    def draft_vocab_size(self) -> int | None:
        return int_or_none(self.config.get("draft_vocab_size"))

    @property
    def provenance(self) -> dict[str, Any]:
        """Return the toolkit's record of how the draft was trained; {} for a draft from elsewhere."""
        return provenance(self.config)

    @property
    def architectures(self) -> list[str]:
        """Return the config's `architectures` as strings ([] when absent or not a list)."""
        archs = self.config.get("architectures")
        return [str(a) for a in archs] if isinstance(archs, list) else []

    @property
    def target_hidden_size(self) -> int | None:
        """Return the width of one captured target state the config declares (None: not declared)."""
        return int_or_none(self.decoder_config.get("target_hidden_size") or self.config.get("target_hidden_size"))

    @property
    def num_attention_heads(self) -> int | None:
        return int_or_none(self.decoder_config.get("num_attention_heads"))

    @property
    def verifier(self) -> str | None:
        """Return the target the layout's reader serves by name (`vllm serve EXPORT`: the speculators
        verifier; "" when that layout's field is empty), or None when the layout names none."""
        return self.layout.verifier(self.config) if self.layout else None

    @property
    def speculators(self) -> dict[str, Any]:
        """Return the `speculators_config` block ({} when absent or not an object)."""
        block = self.config.get("speculators_config")
        return block if isinstance(block, dict) else {}

    @property
    def speculative_tokens(self) -> int | None:
        """Return `speculators_config.proposal_methods[0].speculative_tokens` (vLLM's default draft count)."""
        methods = self.speculators.get("proposal_methods")
        first = methods[0] if isinstance(methods, list) and methods and isinstance(methods[0], dict) else {}
        return int_or_none(first.get("speculative_tokens"))

    @property
    def speculators_model_type(self) -> str | None:
        """Return `speculators_model_type` (the method `vllm serve EXPORT` runs), or None."""
        method = self.config.get("speculators_model_type")
        return str(method) if method else None

    @property
    def has_transformer_layer_config(self) -> bool:
        """Return whether the config has the `transformer_layer_config` object vLLM builds the draft from."""
        return isinstance(self.config.get("transformer_layer_config"), dict)

    @property
    def aux_layer_ids(self) -> list[int] | None:
        """Return the aux layer ids written for the layout's main reader, in its numbering, or None."""
        return self.layout.written_layer_ids(self.config) if self.layout else None



def read_draft(path: str | Path) -> DraftLayout:
    """Return the layout of an export directory (config.json + *.safetensors headers)."""
    root = Path(path)
    if not root.is_dir():
        raise ConfigError(f"draft directory {root} does not exist (give the output of `curator export`)")
    config_path = root / "config.json"
    try:
        config = read_json(config_path)
    except FileNotFoundError:
        raise ConfigError(f"{config_path} is missing: {root} is not an exported draft") from None
    except JSONFileError as exc:  # not JSON, an integer of 5,000 digits, nesting 100K deep
        raise ConfigError(str(exc)) from None
    if not isinstance(config, dict):
        raise ConfigError(f"{config_path} is not a JSON object: {root} is not an exported draft")
    shapes: dict[str, tuple[int, ...]] = {}
    dtypes: dict[str, str] = {}
    for file, handle in safetensors_files(root):
        for key in handle.keys():
            tensor = handle.get_slice(key)
            shapes[key], dtypes[key] = tuple(tensor.get_shape()), str(tensor.get_dtype())
    if not shapes:
        raise ConfigError(f"no *.safetensors weights in {root}")
    return DraftLayout(path=root, layout=layout_of_export(config), config=config, shapes=shapes, dtypes=dtypes)


def safetensors_files(root: Path) -> Any:
    """Yield (file, open handle) for each *.safetensors file; an unreadable one is a ConfigError."""
    for file in sorted(root.glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="pt") as handle:
                yield file, handle
        except (OSError, SafetensorError) as exc:
            raise ConfigError(f"{file} is not a readable safetensors file ({exc}); was it copied completely?") from None
