"""The export layouts, by name: one module each, registered here."""

from __future__ import annotations

from typing import Any

from training.errors import ModelMismatchError, TrainingError
from training.eagle3.layouts.base import DECODER_KEYS, ExportSource, Layout
from training.eagle3.layouts.sglang import SGLangLayout
from training.eagle3.layouts.speculators import SpeculatorsLayout

LAYOUTS: dict[str, Layout] = {layout.name: layout for layout in (SGLangLayout(), SpeculatorsLayout())}
FORMATS = tuple(LAYOUTS)

__all__ = ["DECODER_KEYS", "FORMATS", "LAYOUTS", "ExportSource", "Layout", "layout_named", "layout_of"]


def layout_named(name: str) -> Layout:
    """Return the layout for `--format NAME`."""
    if name not in LAYOUTS:
        raise TrainingError(f"unknown export format {name!r}; choose one of {FORMATS}")
    return LAYOUTS[name]


def layout_of(config: dict[str, Any]) -> Layout:
    """Return the layout an exported config.json is written in."""
    for layout in LAYOUTS.values():
        if layout.recognises(config):
            return layout
    arch = (config.get("architectures") or [""])[0]
    expected = " or ".join(repr(layout.architecture) for layout in LAYOUTS.values())
    raise ModelMismatchError(f"config.json architecture {arch!r} is not an EAGLE-3 draft this toolkit exports "
                             f"(expected {expected})")
