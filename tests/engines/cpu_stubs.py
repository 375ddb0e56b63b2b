"""Import-time stand-ins for the few CUDA-only modules the engines' Python code imports on a CPU.

Each stubbed module imports, and any attribute of it is another stand-in; *calling* one raises,
so a test that reached CUDA-only code would fail loudly instead of computing something else.
Stubbed (see docs/engines.md):
- `torchvision`: SGLang's config package imports its transforms for vision models at import
  time; PyPI's torchvision is a CUDA build that breaks `import transformers` beside a CPU torch.
- `vllm._custom_ops`: SGLang's rotary embedding constructor imports it on non-CUDA machines and
  never calls it for the plain rotary the drafts use.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Any

STUBBED = ("torchvision", "vllm._custom_ops")


class Stub:
    """A stand-in attribute: more stand-ins below it; calling it raises."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Stub(f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self._name} is a CPU test stand-in for CUDA-only code and was called")

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (object,)  # `class X(torchvision.Something)` at import time


class StubModule(ModuleType):
    """A stand-in module: any attribute is a Stub; submodules import as StubModules."""

    __path__: list[str] = []

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Stub(f"{self.__name__}.{attr}")


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if any(fullname == s or fullname.startswith(s + ".") for s in STUBBED):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return StubModule(spec.name)

    def exec_module(self, module: ModuleType) -> None:
        module.__path__ = []
        # transformers asks an importable package without metadata for its version; a stand-in
        # reads as too old for every torchvision fast path it would otherwise take
        module.__version__ = "0.0.0+cpu-stub"


def install() -> None:
    """Put the stand-ins ahead of the real import system (idempotent)."""
    if not any(isinstance(f, _StubFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _StubFinder())
