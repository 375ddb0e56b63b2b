"""Aux layer ids: which target layers feed the draft, and how each engine numbers them.

This module is the one owner of that knowledge. Everything else holds ids in the toolkit's own
numbering and converts only through the functions here.

The toolkit's numbering ("layer-input"): id L is the *input* of decoder layer L, which is
`output_hidden_states[L]` in transformers (index 0 is the embedding output) and the output of
layer L-1. Id N (N = number of layers) is the last layer's output before the final norm. Ids are
kept sorted: both engines concatenate the captured states in layer order, whatever order a config
lists them in, so a draft trained on another order would see its fc inputs permuted.

Engines read the ids in a draft's config.json differently:
- SGLang: the target class's `set_eagle3_layers_to_capture` maps them; its rule for every class of
  SGLang's registry is the table in training.target.sglang_rules (read from SGLang's code). The model loop
  captures the input of layer i for i in range(N) (a few classes also the last output, id N), so an
  id past the model is silently never captured. A class the table does not know, or one SGLang
  cannot serve EAGLE-3 for, is refused rather than assumed.
- vLLM and speculators take the ids as layer inputs, as they are.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from training.errors import ModelMismatchError
from training.target.sglang_rules import RULE_OF_CLASS, SGLANG_CAPTURES_LAST_OUTPUT, SGLANG_VERSION

CONVENTION = "layer-input"
# Conventions a store or checkpoint may record -> offset to the toolkit's numbering. "sglang-input"
# is the name earlier stores used for the same numbering as CONVENTION.
_OFFSET = {CONVENTION: 0, "sglang-input": 0, "output": 1, "specforge-output": 1}

def default_aux_layers(num_layers: int) -> list[int]:
    """Return the default aux layer ids: SGLang's [2, N//2, N-3] ([1, N//2, N-1] for N < 7)."""
    if num_layers < 4:
        raise ModelMismatchError(f"a target with {num_layers} layers is too shallow for three distinct aux layers")
    ids = [2, num_layers // 2, num_layers - 3]
    if len(set(ids)) < 3 or ids != sorted(ids):
        ids = [1, num_layers // 2, num_layers - 1]  # tiny test targets, where N-3 <= N//2
    return ids


def check_layer_ids(layer_ids: Iterable[Any], num_layers: int) -> list[int]:
    """Return the ids as sorted ints, or raise when one repeats or lies outside 0..N."""
    ids = sorted(int(i) for i in layer_ids)
    bad = [i for i in ids if not 0 <= i <= num_layers]
    if bad or not ids or len(set(ids)) != len(ids):
        raise ModelMismatchError(
            f"aux layer ids {ids} must be distinct and lie in 0..{num_layers} for a {num_layers}-layer target "
            "(id L is the input of layer L; N is the last layer's output)"
        )
    return ids


def normalise(layer_ids: Sequence[Any], convention: str) -> list[int]:
    """Return ids recorded in `convention` in the toolkit's numbering; refuse unknown or unsorted ones.

    Unsorted ids cannot be sorted here: the stored states were concatenated in the recorded order,
    which no engine reproduces.
    """
    if convention not in _OFFSET:
        raise ModelMismatchError(f"unknown layer convention {convention!r}; expected one of {sorted(_OFFSET)}")
    ids = [int(i) + _OFFSET[convention] for i in layer_ids]
    if ids != sorted(set(ids)):
        raise ModelMismatchError(
            f"aux layer ids {list(layer_ids)} are not in increasing layer order; SGLang and vLLM concatenate the "
            "captured states in layer order, so these states cannot be served: capture them again"
        )
    return ids


def sglang_rule(architecture: str | None) -> str:
    """Return how SGLang maps config ids to captured layer inputs for a target class; raise for a class
    whose rule is not known or that SGLang cannot serve an EAGLE-3 draft on."""
    rule = RULE_OF_CLASS.get(architecture or "")
    if rule is None:
        raise ModelMismatchError(
            f"target class {architecture!r} is not in SGLang {SGLANG_VERSION}'s model registry, so which layers "
            "SGLang would feed the draft is unknown; serve with vLLM (export --format speculators) or add the "
            "class to training/target/sglang_rules.py from SGLang's code (docs/adding-a-layout-or-engine.md)")
    if rule == "no-eagle3":
        raise ModelMismatchError(
            f"SGLang {SGLANG_VERSION}'s {architecture} has no set_eagle3_layers_to_capture: SGLang refuses EAGLE3 "
            "on this target at start-up; serve the draft with vLLM (export --format speculators)")
    if rule == "opaque":
        raise ModelMismatchError(
            f"SGLang {SGLANG_VERSION}'s {architecture} hands the layer ids to another backend whose rule is not "
            "in SGLang's code; the layers it would feed the draft cannot be checked")
    return rule


def sglang_layers_to_capture(config_ids: Sequence[int] | None, architecture: str | None, num_layers: int) -> list[int]:
    """Return the `layers_to_capture` list SGLang's `set_eagle3_layers_to_capture` sets for a target class."""
    n = num_layers
    rule = sglang_rule(architecture)
    ids = [2, n // 2, n - 3] if config_ids is None else [int(i) for i in config_ids]
    if rule == "plus-one-always" or (config_ids is not None and (
            rule == "plus-one"
            or (rule == "plus-one-if-first-is-one" and ids and ids[0] == 1)
            or (rule == "keep-if-last-is-n" and not (ids and max(ids) == n)))):
        return [i + 1 for i in ids]
    return ids


def sglang_captured(config_ids: Sequence[int] | None, architecture: str | None, num_layers: int) -> list[int]:
    """Return the layer inputs SGLang captures, in order, for a draft config holding `config_ids`."""
    top = num_layers if architecture in SGLANG_CAPTURES_LAST_OUTPUT else num_layers - 1
    # the model's loop visits layers in order and tests membership: order and repeats vanish
    return sorted({i for i in sglang_layers_to_capture(config_ids, architecture, num_layers) if 0 <= i <= top})


def sglang_config_ids(layer_ids: Sequence[int], architecture: str | None, num_layers: int) -> list[int] | None:
    """Return the ids to write in an SGLang draft config so that SGLang captures `layer_ids`.

    None means "write none": the ids equal SGLang's default. Raises when SGLang's rule for the
    target class cannot express the ids at all.
    """
    ids = sorted(int(i) for i in layer_ids)
    for candidate in (None, [i - 1 for i in ids], ids):
        if candidate is not None and min(candidate) < 0:
            continue
        if sglang_captured(candidate, architecture, num_layers) == ids:
            return candidate
    raise ModelMismatchError(
        f"SGLang {SGLANG_VERSION} cannot be told to capture the inputs of layers {ids} of a {architecture} target "
        f"with {num_layers} layers (its rule: {sglang_rule(architecture)}); capture and train on other layers, "
        "e.g. the default, or serve with vLLM (export --format speculators)"
    )


def vllm_captured(config_ids: Sequence[int] | None, num_layers: int) -> list[int]:
    """Return the layer inputs vLLM (and speculators) capture: the ids as written, else the default."""
    if config_ids is None:
        return [2, num_layers // 2, num_layers - 3]
    return sorted({int(i) for i in config_ids})
