"""The trainers' layouts, by the name `curator export-data --layout` takes (one module per trainer)."""

from __future__ import annotations

from curator.handoff.layouts import modelopt, specforge, speculators
from curator.handoff.layouts.base import Layout

LAYOUTS: dict[str, Layout] = {layout.name: layout for layout in (
    speculators.LAYOUT, specforge.OFFLINE, specforge.ONLINE, modelopt.LAYOUT)}
