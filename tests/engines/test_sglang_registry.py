"""training.target.sglang_rules against SGLang 0.5.23's whole model registry: for every class that
`ModelRegistry` lists, SGLang's own `set_eagle3_layers_to_capture` (its own, inherited, or the one of
the language model it builds) sets the same `layers_to_capture` the toolkit predicts, for the ids an
export may write; a class without the method is one the toolkit refuses to export for."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import pkgutil
import re
import sys
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("sglang", reason="SGLang is not installed: run .ci/engines.sh (tests/engines/requirements.txt)")

from sglang_cpu import init_sglang  # noqa: E402

from training.errors import ModelMismatchError  # noqa: E402
from training.target.layers import sglang_layers_to_capture  # noqa: E402
from training.target.sglang_rules import RULE_OF_CLASS, SGLANG_CAPTURES_LAST_OUTPUT, SGLANG_VERSION  # noqa: E402

N = 32
IDS: list[list[int] | None] = [None, [1, 15, 28], [2, 16, 29], [0, 1, 2], [5, 6, 7], [1, 20, 31], [2, 16, 32],
                               [3, 10, 17, 24]]


@pytest.fixture(scope="module")
def registry() -> dict[str, type]:
    import sglang
    from importlib.metadata import version

    assert version("sglang") == SGLANG_VERSION == sglang.__version__
    init_sglang()
    from sglang.srt.models.registry import ModelRegistry

    return {name: cls for name, cls in ModelRegistry.models.items() if not isinstance(cls, str)}


class InnerModel:
    """`self.model` of a target: its layers, and the inner `set_eagle3_layers_to_capture(list)` that
    qwen2_moe/qwen3_moe/qwen3_next/qwen3_5 models define (store the list, flag those layers)."""

    def __init__(self, n: int) -> None:
        self.layers = [SimpleNamespace() for _ in range(n)]

    def set_eagle3_layers_to_capture(self, layers: Any) -> None:
        self.layers_to_capture = layers


def holder(n: int, language_model: Any = None) -> SimpleNamespace:
    """What the method reads of a target: its pipeline rank, config, inner model (and language model)."""
    config = SimpleNamespace(num_hidden_layers=n, text_config=SimpleNamespace(num_hidden_layers=n))
    return SimpleNamespace(pp_group=SimpleNamespace(is_last_rank=True), config=config, model=InnerModel(n),
                           language_model=language_model)


def delegate_class(cls: type) -> type | None:
    """Return the class a composite model builds as `self.language_model`, read from its own source."""
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if not inspect.isfunction(init):
            continue
        source = inspect.getsource(init)
        match = re.search(r"self\.language_model = (\w+)\(", source)
        if match:
            name = match.group(1)
            local = re.search(rf"from ([\w.]+) import [\w, ]*\b{name}\b", source)  # an import inside __init__
            module = importlib.import_module(local.group(1)) if local else sys.modules[klass.__module__]
            return getattr(module, name)
    return None


def bound(cls: type, n: int) -> SimpleNamespace:
    """A language-model stand-in whose `set_eagle3_layers_to_capture` is `cls`'s real method."""
    inner = holder(n)
    inner.set_eagle3_layers_to_capture = lambda ids: cls.set_eagle3_layers_to_capture(inner, ids)
    return inner


def real_layers_to_capture(cls: type, ids: list[int] | None, n: int) -> Any:
    """Return the list SGLang's method on `cls` sets, wherever it puts it."""
    delegate = delegate_class(cls)
    target = holder(n, bound(delegate, n) if delegate is not None else SimpleNamespace())
    cls.set_eagle3_layers_to_capture(target, None if ids is None else list(ids))
    for where in (target.model, getattr(target.language_model, "model", None), target.language_model):
        if where is not None and hasattr(where, "layers_to_capture"):
            return where.layers_to_capture
    raise AssertionError(f"{cls.__name__}.set_eagle3_layers_to_capture set no layers_to_capture")


def test_the_table_names_every_class_of_sglangs_registry(registry: dict[str, type]) -> None:
    unimported = not_imported_entry_classes(registry)
    assert set(RULE_OF_CLASS) == set(registry) | set(unimported)


def test_sglangs_own_method_sets_the_layers_the_toolkit_predicts_for_every_class(registry: dict[str, type]) -> None:
    checked, wrong = 0, []
    for name, cls in sorted(registry.items()):
        rule = RULE_OF_CLASS[name]
        if rule == "no-eagle3":
            # SGLang's attention_backend_setup refuses EAGLE3 on a model without the method
            assert not hasattr(cls, "set_eagle3_layers_to_capture"), name
            continue
        for ids in IDS:
            real = real_layers_to_capture(cls, ids, N)
            if rule == "opaque":  # handed on untouched to a backend outside SGLang's code
                assert real == ids, name
                continue
            ours = sglang_layers_to_capture(ids, name, N)
            if list(real) != ours:
                wrong.append(f"{name} {ids}: SGLang {list(real)}, toolkit {ours}")
        checked += rule != "opaque"
    assert not wrong, "\n".join(wrong)
    assert checked >= 70  # the classes with a rule: every one ran SGLang's method


def test_unknown_and_non_eagle3_classes_are_refused(registry: dict[str, type]) -> None:
    without = next(n for n, c in sorted(registry.items()) if not hasattr(c, "set_eagle3_layers_to_capture"))
    for arch in (without, "NotAnSGLangModelForCausalLM"):
        with pytest.raises(ModelMismatchError):
            sglang_layers_to_capture([2, 16, 29], arch, N)


# the module whose model loop the class runs, for the classes that also capture the last output
LOOPS = {"GptOssForCausalLM": "gpt_oss", "Gemma3ForCausalLM": "gemma3_causal",
         "Gemma3ForConditionalGeneration": "gemma3_causal", "Gemma4ForCausalLM": "gemma4_causal",
         "Gemma4ForConditionalGeneration": "gemma4_causal"}


def test_the_classes_said_to_capture_the_last_output_have_a_loop_that_does(registry: dict[str, type]) -> None:
    assert set(LOOPS) == SGLANG_CAPTURES_LAST_OUTPUT
    for name, module in LOOPS.items():
        source = inspect.getsource(importlib.import_module(f"sglang.srt.models.{module}"))
        assert re.search(r"if (self\.end_layer|num_layers) in self\.layers_to_capture", source), name
    # and a plain loop does not
    assert not re.search(r"(end_layer|num_layers) in self\.layers_to_capture",
                         inspect.getsource(importlib.import_module("sglang.srt.models.llama")))


def not_imported_entry_classes(registry: dict[str, type]) -> list[str]:
    """Return the EntryClass names of registry modules that do not import on a CPU (CUDA-only kernels),
    read from their source, after checking that none defines set_eagle3_layers_to_capture."""
    import sglang.srt.models as models

    names = []
    for info in pkgutil.iter_modules(models.__path__, "sglang.srt.models."):
        if info.ispkg or info.name in sys.modules:
            continue
        spec = importlib.util.find_spec(info.name)
        assert spec is not None and spec.origin is not None
        source = open(spec.origin, encoding="utf-8").read()
        for node in ast.parse(source).body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "EntryClass" for t in node.targets):
                value = node.value
                entries = value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value]
                assert "set_eagle3_layers_to_capture" not in source, info.name
                names += [ast.unparse(e) for e in entries]
    assert all(RULE_OF_CLASS.get(n) == "no-eagle3" for n in names), names
    return names
