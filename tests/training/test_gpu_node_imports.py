"""The GPU stages' code imports on a bare GPU node.

A GPU image has torch, transformers, safetensors, numpy and pyarrow, but none of the data side's
libraries. Reading a mix, generating in-process, capturing hidden states and the reference
benchmark must not import them: in 2026-12 `curator.mix`'s package init imported the mix build
(datasketch), and the H200 reference run died at its first import.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Libraries the GPU image lacks (pydantic is carried as wheels, so it may be imported).
ABSENT = ("datasets", "duckdb", "anthropic", "datasketch", "openai")

BLOCKER = f"""
import importlib.abc, sys
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {ABSENT!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (absent on a GPU node)")
sys.meta_path.insert(0, Absent())
"""


def _import_without_data_side(modules: list[str]) -> subprocess.CompletedProcess[str]:
    code = BLOCKER + "".join(f"import {m}\n" for m in modules) + "print('ok')\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)


@pytest.mark.slow
def test_gpu_stages_import_without_the_data_side_libraries() -> None:
    done = _import_without_data_side([
        "curator.rows.schema", "curator.mix.prompts", "curator.generate", "curator.hidden.capture",
        "bench.reference.run", "training.train.trainer", "training.export.export", "training.eval.simulate",
    ])
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_the_blocker_does_block() -> None:
    # Without this, a blocker that never fires would make the test above pass on any code.
    done = _import_without_data_side(["curator.mix.build"])
    assert done.returncode != 0 and "absent on a GPU node" in done.stderr


def test_the_package_names_still_resolve_lazily() -> None:
    import curator.mix as mix
    from curator.mix.build import build_mix
    from curator.rows.schema import open_mix

    assert mix.build_mix is build_mix and mix.open_mix is open_mix
    assert set(mix.__all__) >= {"build_mix", "load_recipe", "open_mix", "recipe_from_catalog"}
    try:
        mix.not_a_name  # noqa: B018
    except AttributeError as exc:
        assert "not_a_name" in str(exc)
    else:
        raise AssertionError("an unknown name resolved")
