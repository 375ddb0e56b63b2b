"""YAML for files the user did not write (recipes, run configs, briefs): plain data, no aliases.

`yaml.safe_load` builds no objects, but it does follow aliases: nine lines of anchors that each
repeat the one before ("billion laughs", under 500 bytes) stand for 10^9 strings. PyYAML shares
them, so loading is cheap, and the first thing that walks the result (validation, an error
message that quotes the value, json.dumps) expands it: gigabytes and a minute before a
MemoryError. No config of this toolkit needs aliases, so they are refused where they are read,
with the line that uses one. The errors are yaml.YAMLError, which every reader already catches.

Kept in `training/` (PyYAML is optional there) so that the model side reads its configs with
it and the data side (curator.mix.recipe, ...) imports it from here.
"""

from __future__ import annotations

import sys
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError
from yaml.events import AliasEvent
from yaml.nodes import Node, ScalarNode


class NoAliasLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses aliases (`*name`) and with them `<<: *base` merges."""

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        if self.check_event(AliasEvent):
            event = self.peek_event()
            raise ComposerError(None, None, f"uses the alias *{event.anchor}: aliases (and `<<: *name` merges) are "
                                "not allowed here; write the values out", event.start_mark)
        return super().compose_node(parent, index)

    def construct_yaml_int(self, node: ScalarNode) -> int:
        # int() refuses more than sys.get_int_max_str_digits() (4300) digits with a bare ValueError, which
        # every reader would let through as "unexpected": made a YAML error that names the line instead
        try:
            return super().construct_yaml_int(node)
        except ValueError as exc:
            raise ConstructorError(None, None, f"an integer of {len(str(node.value))} characters: longer than "
                                   f"the {sys.get_int_max_str_digits()} digits Python reads ({type(exc).__name__})",
                                   node.start_mark) from None


# the loader's table of constructors is looked up by tag, not by method: point the int tag at the override
NoAliasLoader.add_constructor("tag:yaml.org,2002:int", NoAliasLoader.construct_yaml_int)


def safe_load(text: str) -> Any:
    """Return the plain data (dicts, lists, scalars) of a YAML document; aliases and deep nesting are a yaml.YAMLError."""
    try:
        return yaml.load(text, Loader=NoAliasLoader)  # noqa: S506 - a SafeLoader, minus aliases
    except RecursionError:
        raise yaml.YAMLError("nested too deeply to be a config") from None


def error_text(exc: yaml.YAMLError) -> str:
    """Return what a YAML error says, to follow "PATH: ": "line N not valid YAML: problem" (no line when unknown)."""
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1} " if mark is not None else ""
    return f"{where}not valid YAML: {getattr(exc, 'problem', None) or exc}"
