"""The draft kinds by name: `register` adds one, and the core asks here for the kind a run names
(`draft_kind=`), a checkpoint records (`meta.json` `draft_kind`), an export's config.json is written
by, or a loaded draft is an instance of. Nothing outside a kind's own folder and `training/drafts/`
imports a kind.

EAGLE-3 is registered built in (`training/drafts/eagle3.py`); a kind from elsewhere (a plugin, a
test) calls `register` before the run, in every process that runs it: ranks started by torchrun or
`train_local_ranks` import the registry afresh, so such a kind registers in the module their entry
imports. This module loads no torch: `curator doctor` and the engines' checks ask it for layouts.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from training.drafts.eagle3 import Eagle3Kind
from training.drafts.kind import DEFAULT_KIND, DraftKind
from training.eagle3.layouts.base import Layout
from training.errors import ModelMismatchError, TrainingError
from training.io.export_folder import read_export_config

if TYPE_CHECKING:
    import torch.nn as nn

KINDS: dict[str, DraftKind] = {}


def register(kind: DraftKind) -> DraftKind:
    """Add `kind` under its name and return it; a second kind of the same name is refused."""
    if kind.name in KINDS and KINDS[kind.name] is not kind:
        raise TrainingError(f"a draft kind named {kind.name!r} is registered already")
    clash = [f for f in kind.formats for other in KINDS.values() if other is not kind and f in other.formats]
    if clash:  # `--format` names one layout: two kinds may not claim it
        raise TrainingError(f"draft kind {kind.name!r}: export formats {clash} belong to another kind")
    KINDS[kind.name] = kind
    return kind


def kind_named(name: str) -> DraftKind:
    """Return the kind `draft_kind=NAME` names."""
    if name not in KINDS:
        raise TrainingError(f"unknown draft kind {name!r}; choose one of {', '.join(sorted(KINDS))}")
    return KINDS[name]


def kind_of_meta(meta: dict[str, Any]) -> DraftKind:
    """Return the kind a checkpoint's meta.json records (one from before kinds were recorded: EAGLE-3)."""
    return kind_named(str(meta.get("draft_kind") or DEFAULT_KIND))


def kind_of_format(fmt: str) -> DraftKind:
    """Return the kind whose export layouts include `--format FMT`."""
    for kind in KINDS.values():
        if fmt in kind.formats:
            return kind
    raise TrainingError(f"unknown export format {fmt!r}; choose one of {formats()}")


def formats() -> tuple[str, ...]:
    """Return every registered kind's export formats."""
    return tuple(f for kind in KINDS.values() for f in kind.formats)


def layouts() -> list[Layout]:
    """Return every registered kind's export layouts that the doctor can check."""
    return [layout for kind in KINDS.values() for layout in kind.layouts.values()]


def layout_of_export(config: dict[str, Any]) -> Layout | None:
    """Return the layout (of any kind) an exported config.json is written in; None: no kind's layout reads it."""
    return next((layout for layout in layouts() if layout.recognises(config)), None)


def kind_of_export(config: dict[str, Any]) -> DraftKind:
    """Return the kind an exported config.json is written by."""
    for kind in KINDS.values():
        if kind.recognises(config):
            return kind
    arch = (config.get("architectures") or [""])[0]
    raise ModelMismatchError(f"config.json architecture {arch!r} is not a draft this toolkit exports (its kinds: "
                             f"{', '.join(sorted(KINDS))})")


def kind_of_model(draft: nn.Module) -> DraftKind:
    """Return the kind a loaded draft belongs to."""
    for kind in KINDS.values():
        if kind.owns(draft):
            return kind
    raise TrainingError(f"{type(draft).__name__} is no registered draft kind's model")


def load_export(export_dir: str | Path, target_dir: str | Path | None = None) -> nn.Module:
    """Return the draft in an export directory (any kind, any layout), float32, in eval mode.

    Embeddings come from the export when it has them, else from `target_dir` (or the target recorded at
    export time when that directory still exists). A broken export is refused (ModelMismatchError).
    """
    root = Path(export_dir)
    config = read_export_config(root)
    return kind_of_export(config).load_export(root, config, target_dir)


def exported_verifier(export_dir: str | Path) -> str | None:
    """Return the target an export names for its server to load (None: its layout names none)."""
    config = read_export_config(export_dir)
    return kind_of_export(config).verifier(config)


register(Eagle3Kind())
