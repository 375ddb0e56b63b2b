"""Fixtures of the engine-code tests: a tiny target, drafts trained on its states.

The engine tests run in the engines' own virtual environment (`.ci/engines.sh`, pinned in
tests/engines/requirements.txt); in any other environment each module skips with the reason.
(A module, not a conftest.py: tests/conftest.py is imported as `conftest` by test_trainer.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.training.train.test_trainer import AUX_LAYERS, sharp_target, store_dir, tiny_config  # noqa: E402,F401  (fixtures)


@pytest.fixture(scope="session")
def run_dir(store_dir: Path, sharp_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A draft trained briefly on the tiny target's states at AUX_LAYERS, with a 64-token draft vocab."""
    import torch

    from training.train.trainer import train

    out = tmp_path_factory.mktemp("engines-run") / "run"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(tiny_config(store_dir, sharp_target, out, max_steps=30, draft_vocab_size=64, eval_fraction=0.0))
    finally:
        torch.set_num_threads(threads)
    return out


@pytest.fixture(scope="session")
def full_vocab_run(store_dir: Path, sharp_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A draft whose vocabulary is the whole target's (no d2t/t2d in its exports)."""
    import json

    from training.train.trainer import train

    vocab = json.loads((sharp_target / "config.json").read_text())["vocab_size"]
    out = tmp_path_factory.mktemp("engines-full") / "run"
    train(tiny_config(store_dir, sharp_target, out, max_steps=2, draft_vocab_size=vocab, eval_fraction=0.0))
    return out
