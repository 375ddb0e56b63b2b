"""Mixes: recipes, row formats, dedup and the build of a prompt mix."""

from curator.mix.build import build_mix, recipe_from_catalog
from curator.mix.recipe import Recipe, load_recipe, recipe_from_dict
from curator.mix.schema import Mix, open_mix, read_manifest

__all__ = ["Mix", "Recipe", "build_mix", "load_recipe", "open_mix", "read_manifest", "recipe_from_catalog", "recipe_from_dict"]
