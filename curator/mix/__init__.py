"""Mixes: recipes, row formats, dedup and the build of a prompt mix.

The names below load on first use: reading a mix (`curator.rows.schema`) must not import the
build's dependencies (datasketch, datasets), which the GPU stages' machines need not have.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "build_mix": "curator.mix.build", "recipe_from_catalog": "curator.mix.build",
    "Recipe": "curator.mix.recipe", "load_recipe": "curator.mix.recipe", "recipe_from_dict": "curator.mix.recipe",
    "Mix": "curator.rows.schema", "open_mix": "curator.rows.schema", "read_manifest": "curator.rows.schema",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'curator.mix' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
