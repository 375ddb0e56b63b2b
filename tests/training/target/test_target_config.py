"""One reader of the target's config.json: every stage sees the same widths, whatever the nesting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from training.eagle3.model import DraftConfig
from training.errors import TrainingError
from training.capture.plan import load_shape
from training.target.config import read_target_config

TEXT = {"hidden_size": 7168, "num_hidden_layers": 61, "vocab_size": 163840, "num_attention_heads": 64,
        "num_key_value_heads": 64, "intermediate_size": 18432, "model_type": "deepseek_v3"}


@pytest.mark.parametrize("key", ["text_config", "language_config", "llm_config"])
def test_every_nesting_a_real_model_uses_gives_the_same_shape_everywhere(tmp_path: Path, key: str) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25", key: TEXT,
        "vision_config": {"hidden_size": 1152}}))
    cfg = read_target_config(model)
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]) == (7168, 61, 163840)
    assert cfg["architectures"] == ["KimiK25ForConditionalGeneration"]  # the class an engine builds
    shape = load_shape(model)
    assert (shape.hidden_size, shape.num_layers, shape.vocab_size) == (7168, 61, 163840)
    draft = DraftConfig.from_target_config(cfg, draft_vocab_size=32000, aux_layer_ids=[2, 30, 58])
    assert draft.target_hidden_size == 7168 and draft.vocab_size == 163840


def test_a_config_without_widths_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mystery"}))
    with pytest.raises(TrainingError, match="lacks hidden_size"):
        read_target_config(tmp_path)
    with pytest.raises(TrainingError, match="no config.json"):
        read_target_config(tmp_path / "absent")
