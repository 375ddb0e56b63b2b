"""Aux layer ids: the toolkit's numbering, and what SGLang and vLLM capture from a config's ids.

The expected values are SGLang 0.5.23's `set_eagle3_layers_to_capture` rules per target class.
"""

from __future__ import annotations

import pytest

from training.errors import ModelMismatchError
from training.target.layers import (
    check_layer_ids,
    default_aux_layers,
    normalise,
    sglang_captured,
    sglang_config_ids,
    vllm_captured,
)


def test_default_is_sglangs_and_kimi_k25_gets_2_30_58() -> None:
    assert default_aux_layers(61) == [2, 30, 58]
    assert default_aux_layers(32) == [2, 16, 29]


def test_llama_and_qwen_targets_add_one_so_inputs_are_written_one_lower() -> None:
    # a Llama-3.1-8B-shaped target (32 layers) trained on inputs [3, 17, 29]
    for arch in ("LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM"):
        written = sglang_config_ids([3, 17, 29], arch, 32)
        assert written == [2, 16, 28]
        assert sglang_captured(written, arch, 32) == [3, 17, 29]


def test_the_default_layers_are_left_out_of_an_sglang_config() -> None:
    assert sglang_config_ids([2, 16, 29], "LlamaForCausalLM", 32) is None
    assert sglang_captured(None, "LlamaForCausalLM", 32) == [2, 16, 29]


def test_deepseek_and_kimi_add_one_only_when_the_first_id_is_one() -> None:
    for arch in ("DeepseekV3ForCausalLM", "KimiK25ForConditionalGeneration"):
        assert sglang_captured([1, 29, 57], arch, 61) == [2, 30, 58]
        assert sglang_captured([3, 30, 58], arch, 61) == [3, 30, 58]
        written = sglang_config_ids([3, 20, 40], arch, 61)
        assert written is not None and sglang_captured(written, arch, 61) == [3, 20, 40]


def test_inputs_sglang_cannot_express_are_refused() -> None:
    # deepseek_v2: inputs starting at layer 1 need ids starting at 0 (taken as is) or 1 (plus one)
    with pytest.raises(ModelMismatchError, match="cannot be told"):
        sglang_config_ids([1, 20, 40], "DeepseekV3ForCausalLM", 61)


def test_gpt_oss_keeps_ids_that_reach_the_last_layer() -> None:
    assert sglang_captured([2, 12, 24], "GptOssForCausalLM", 24) == [2, 12, 24]
    assert sglang_captured([1, 11, 20], "GptOssForCausalLM", 24) == [2, 12, 21]


def test_an_id_past_the_model_is_never_captured_by_a_llama_target() -> None:
    # writing the inputs as they are (the old export) for a tiny 8-layer target: 5+1, 6+1, 7+1
    assert sglang_captured([5, 6, 7], "LlamaForCausalLM", 8) == [6, 7]


def test_vllm_takes_ids_as_layer_inputs() -> None:
    assert vllm_captured([2, 30, 58], 61) == [2, 30, 58]
    assert vllm_captured(None, 61) == [2, 30, 58]


def test_stores_in_any_recorded_numbering_normalise_to_inputs() -> None:
    assert normalise([1, 30, 57], "specforge-output") == [2, 31, 58]
    assert normalise([2, 31, 58], "sglang-input") == [2, 31, 58]
    with pytest.raises(ModelMismatchError, match="layer order"):
        normalise([30, 2, 58], "layer-input")
    with pytest.raises(ModelMismatchError, match="unknown layer convention"):
        normalise([1, 2, 3], "sideways")


def test_user_ids_are_sorted_and_checked() -> None:
    assert check_layer_ids([30, 2, 58], 61) == [2, 30, 58]
    with pytest.raises(ModelMismatchError):
        check_layer_ids([2, 2, 58], 61)
    with pytest.raises(ModelMismatchError):
        check_layer_ids([2, 30, 62], 61)


@pytest.mark.parametrize("arch", ["GlmMoeDsaForCausalLM", "MistralLarge3ForCausalLM"])
def test_glm5_and_mistral_large_3_inherit_deepseeks_rule(arch: str) -> None:
    # the case: a 61-layer GLM-5 trained on inputs [3, 20, 40] is written as they are, not one lower
    written = sglang_config_ids([3, 20, 40], arch, 61)
    assert written == [3, 20, 40]
    assert sglang_captured(written, arch, 61) == [3, 20, 40]
    assert sglang_captured([2, 19, 39], arch, 61) == [2, 19, 39]  # what the old export wrote: the wrong layers


def test_minimax_m3_vl_adds_one_to_its_default_too() -> None:
    assert sglang_captured(None, "MiniMaxM3SparseForConditionalGeneration", 32) == [3, 17, 30]
    assert sglang_config_ids([3, 17, 30], "MiniMaxM3SparseForConditionalGeneration", 32) is None
    assert sglang_config_ids([2, 16, 29], "MiniMaxM3SparseForConditionalGeneration", 32) == [1, 15, 28]


@pytest.mark.parametrize(("arch", "why"), [
    ("NoSuchModelForCausalLM", "not in SGLang 0.5.23's model registry"),
    (None, "not in SGLang"),
    ("ArceeForCausalLM", "has no set_eagle3_layers_to_capture"),
    ("MindSporeForCausalLM", "another backend"),
])
def test_a_class_without_a_known_rule_is_refused_not_assumed(arch: str | None, why: str) -> None:
    with pytest.raises(ModelMismatchError, match=why):
        sglang_config_ids([2, 16, 29], arch, 32)
    with pytest.raises(ModelMismatchError, match=why):
        sglang_captured(None, arch, 32)


def test_the_rule_table_names_each_registry_class_once_with_a_known_rule() -> None:
    from training.target.sglang_rules import RULE_OF_CLASS, SGLANG_CAPTURES_LAST_OUTPUT, SGLANG_RULES

    names = [c for classes in SGLANG_RULES.values() for c in classes]
    assert len(names) == len(set(names)) == len(RULE_OF_CLASS) == 290  # SGLang 0.5.23's registry
    assert set(SGLANG_RULES) == {"plus-one", "plus-one-if-first-is-one", "keep-if-last-is-n", "plus-one-always",
                                 "opaque", "no-eagle3"}
    assert SGLANG_CAPTURES_LAST_OUTPUT <= {c for c, r in RULE_OF_CLASS.items() if r not in ("opaque", "no-eagle3")}
    family = {"DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "KimiK25ForConditionalGeneration",
              "Glm4MoeLiteForCausalLM", "GlmMoeDsaForCausalLM", "MistralLarge3ForCausalLM"}
    assert family <= set(SGLANG_RULES["plus-one-if-first-is-one"])


def test_gemma_captures_the_last_layers_output_like_gpt_oss() -> None:
    assert sglang_config_ids([2, 16, 32], "Gemma3ForCausalLM", 32) == [1, 15, 31]
    with pytest.raises(ModelMismatchError, match="cannot be told"):
        sglang_config_ids([2, 16, 32], "LlamaForCausalLM", 32)
