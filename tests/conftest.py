"""Shared fixtures: a tiny chat target built by the tests themselves (no downloads)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import torch

from training.target.toy import build_target

# The suite's models are tiny, so every op is per-call overhead, and a second thread only waits for
# a core on a busy CI machine (the demo target's train step: 3.0-3.8 s on 2 threads against
# 0.5-1.4 s on 1, issue 30). Subprocesses the tests start choose their own.
torch.set_num_threads(1)

WORDS = (
    "def return import class self value list dict print for while if else elif try except "
    "lambda yield async await with open file read write path json data model token layer "
    "hidden state draft target accept length speculative decode batch tensor shape"
).split()


def toy_corpus(n: int = 400, seed: int = 0) -> list[str]:
    """Return `n` short code-ish lines from a fixed vocabulary (deterministic)."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 16))) for _ in range(n)]


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-init 4-layer Llama (hidden 64) with a BPE tokenizer and chat template, saved."""
    out = tmp_path_factory.mktemp("tiny_target")
    build_target(toy_corpus(), out, vocab_size=512, seed=0, hidden_size=64, num_layers=4)
    return out


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def target(tiny_target: Path):
    """The tiny target loaded as (model, tokenizer), on the one thread set above. A module may define
    its own `target`."""
    from training.eval.evaluate import load_target

    return load_target(tiny_target)


def real_model_folder() -> Path | None:
    """The SmolLM2 target folder `curator target smollm2` made (its marker checked), or None.

    Tests never download it: CI makes it before the suite (.ci/smollm2.sh) and names it in
    $CURATOR_SMOLLM2; on another machine the cache's folder is used when `curator target smollm2`
    ran there. With $CURATOR_REQUIRE_REAL set (CI) a missing folder fails the tests, never skips them.
    """
    from curator.targets.convert import made_from
    from curator.targets.registry import KNOWN, default_folder

    named = os.environ.get("CURATOR_SMOLLM2")
    folder = Path(named) if named else default_folder(KNOWN["smollm2"], "float32")
    mark = made_from(folder)
    return folder if mark and mark.get("gguf_sha256") == KNOWN["smollm2"].gguf_sha256 else None


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """The real target, SmolLM2-135M-Instruct, as a Hugging Face folder (see real_model_folder)."""
    folder = real_model_folder()
    if folder is None:
        message = "no SmolLM2 target folder: run `curator target smollm2` (or .ci/smollm2.sh) first"
        if os.environ.get("CURATOR_REQUIRE_REAL"):
            pytest.fail(message)
        pytest.skip(message)
    return folder
