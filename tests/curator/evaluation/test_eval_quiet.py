"""`curator eval` turns transformers' own "Loading weights" bar off before it loads the target (issue 46
item 8): that bar would cut into the eval's lines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from curator.cli import main


def test_eval_loads_the_target_with_the_library_bars_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    from huggingface_hub.utils import are_progress_bars_disabled, enable_progress_bars
    from transformers.utils import logging as transformers_logging

    import training.drafts.registry
    import training.eval.evaluate

    seen: dict[str, bool] = {}

    def load_target(*args: Any, **kwargs: Any) -> Any:
        seen["transformers bar"] = transformers_logging.is_progress_bar_enabled()
        seen["hub bars off"] = are_progress_bars_disabled()
        raise SystemExit(3)  # the measurement itself is not what this test is about

    monkeypatch.setattr(training.drafts.registry, "load_export", lambda *a, **k: object())
    monkeypatch.setattr(training.eval.evaluate, "load_target", load_target)
    transformers_logging.enable_progress_bar()
    enable_progress_bars()
    model = tmp_path / "model"
    model.mkdir()
    (tmp_path / "prompts.txt").write_text("hello\n")
    try:
        with pytest.raises(SystemExit):
            main(["eval", "--model", str(model), "--draft", str(model), "--prompts", str(tmp_path / "prompts.txt"),
                  "--device", "cpu"])
    finally:
        transformers_logging.enable_progress_bar()
        enable_progress_bars()
    assert seen == {"transformers bar": False, "hub bars off": True}
