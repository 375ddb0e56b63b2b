"""SGLang 0.5.23 reads the SGLang-layout export as trained: its own LlamaForCausalLMEagle3 and
load_weights give the toolkit draft's logits, and its set_eagle3_layers_to_capture feeds the draft
the layers it learned from, for every target class whose rule differs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("sglang", reason="SGLang is not installed: run .ci/engines.sh (tests/engines/requirements.txt)")

import torch  # noqa: E402

from engine_fixtures import run_dir, sharp_target, store_dir  # noqa: E402,F401  (fixtures)
from sglang_cpu import (  # noqa: E402
    SGLangDraft,
    SGLangProposer,
    captured_by_model_loop,
    config_layer_ids,
    sglang_layers_to_capture,
)
from training.eval.evaluate import evaluate, load_target  # noqa: E402
from training.eval.prompts import EvalPrompt  # noqa: E402
from training.eagle3.proposer import DraftProposer  # noqa: E402
from training.export.export import export_checkpoint  # noqa: E402
from training.eagle3.load import load_draft  # noqa: E402
from training.target.layers import default_aux_layers, sglang_captured, sglang_config_ids  # noqa: E402
from training.target.head import load_embeddings  # noqa: E402


@pytest.fixture(scope="module")
def sglang_export(run_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_checkpoint(run_dir, tmp_path_factory.mktemp("sg") / "draft", fmt="sglang")


def test_sglang_loads_every_weight_and_computes_the_toolkit_drafts_logits(sglang_export: Path, sharp_target: Path) -> None:
    sg = SGLangDraft(sglang_export, load_embeddings(sharp_target))
    ours = load_draft(sglang_export, target_dir=sharp_target)
    # every parameter SGLang built was filled from the file (no NaN/init leftovers): compare them
    params = dict(sg.model.named_parameters())
    H = ours.config.hidden_size
    qkv = params["model.layers.0.self_attn.qkv_proj.weight"]
    assert torch.equal(qkv, torch.cat([ours.midlayer.self_attn.q_proj.weight, ours.midlayer.self_attn.k_proj.weight,
                                       ours.midlayer.self_attn.v_proj.weight]))
    assert torch.equal(params["model.fc.weight"], ours.fc.weight) and torch.equal(params["lm_head.weight"], ours.lm_head.weight)
    assert torch.equal(sg.hot_token_id(), ours.draft_ids())  # d2t + arange
    T = 11
    ids = torch.randint(0, ours.config.vocab_size, (T,))
    aux = torch.randn(T, 3 * H)
    logits, hidden = sg.forward(ids, aux, torch.arange(T))
    with torch.no_grad():
        want = ours(ids[None], aux[None])
    assert (logits - want.logits[0]).abs().max() < 1e-4
    assert (hidden - want.hidden[0]).abs().max() < 1e-4


# (target class, layers, trained-on inputs): the rule families of set_eagle3_layers_to_capture
RULES = [("LlamaForCausalLM", 32, [2, 16, 29]), ("LlamaForCausalLM", 32, [3, 17, 29]),
         ("LlamaForCausalLM", 4, [1, 2, 3]), ("Qwen3ForCausalLM", 48, [2, 24, 45]), ("Qwen3ForCausalLM", 48, [1, 23, 44]),
         ("DeepseekV3ForCausalLM", 61, [2, 30, 58]), ("DeepseekV3ForCausalLM", 61, [3, 20, 40]),
         ("GptOssForCausalLM", 24, [2, 12, 21]), ("GptOssForCausalLM", 24, [2, 12, 24])]


@pytest.mark.parametrize(("arch", "n", "inputs"), RULES, ids=[f"{a}-{n}-{i}" for a, n, i in RULES])
def test_sglang_captures_what_the_export_was_trained_on(arch: str, n: int, inputs: list[int]) -> None:
    written = sglang_config_ids(inputs, arch, n)
    captured = captured_by_model_loop(sglang_layers_to_capture(arch, n, written), arch, n)
    assert captured == inputs
    assert sglang_captured(written, arch, n) == captured


@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "Qwen3ForCausalLM", "DeepseekV3ForCausalLM", "GptOssForCausalLM"])
@pytest.mark.parametrize("ids", [None, [1, 15, 28], [2, 16, 29], [0, 1, 2], [5, 6, 7], [1, 20, 31], [2, 16, 32]])
def test_training_layers_predicts_sglangs_rule_for_any_ids(arch: str, ids: list[int] | None) -> None:
    n = 32
    real = captured_by_model_loop(sglang_layers_to_capture(arch, n, ids), arch, n)
    assert sglang_captured(ids, arch, n) == real


def test_the_export_writes_the_ids_sglang_reads(sglang_export: Path, run_dir: Path) -> None:
    config = json.loads((sglang_export / "config.json").read_text())
    n = 4
    layers = sglang_layers_to_capture("LlamaForCausalLM", n, config_layer_ids(sglang_export))
    assert captured_by_model_loop(layers, "LlamaForCausalLM", n) == config["curator"]["aux_layer_inputs"]
    assert default_aux_layers(32) == captured_by_model_loop(sglang_layers_to_capture("LlamaForCausalLM", 32, None),
                                                            "LlamaForCausalLM", 32)


def test_sglang_served_draft_accepts_as_curator_eval_reports(sglang_export: Path, sharp_target: Path) -> None:
    """The end-to-end check: acceptance with SGLang's module and layer rule equals the toolkit draft's."""
    target, tokenizer = load_target(sharp_target)
    sg = SGLangDraft(sglang_export, load_embeddings(sharp_target))
    n = int(target.config.num_hidden_layers)
    arch = target.config.architectures[0]
    captured = captured_by_model_loop(sglang_layers_to_capture(arch, n, config_layer_ids(sglang_export)), arch, n)
    prompts = [EvalPrompt(id=f"p{i}", messages=[{"role": "user", "content": text}])
               for i, text in enumerate(["def return import class", "hidden state draft target", "for while if else"])]
    kw = dict(steps=3, topk=1, max_new_tokens=24)
    theirs = evaluate(target, tokenizer, SGLangProposer(sg, captured), prompts, **kw)
    ours = evaluate(target, tokenizer, DraftProposer(load_draft(sglang_export, target_dir=sharp_target)), prompts, **kw)
    assert theirs.overall.acceptance_length > 1.0  # the trained draft is accepted at all
    assert abs(theirs.overall.acceptance_length - ours.overall.acceptance_length) < 0.05
