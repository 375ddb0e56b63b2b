"""The draft model: SGLang's parameter layout, fc skipped on H-wide input, TTT attention equals inference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from training.eagle3.model import DraftConfig, Eagle3Draft, KVCache, TTTCache
from training.errors import ModelMismatchError
from training.target.head import TargetHead, load_embeddings, load_lm_head

CFG = dict(hidden_size=32, target_hidden_size=24, num_attention_heads=4, num_key_value_heads=2,
           intermediate_size=64, vocab_size=100, draft_vocab_size=50)


def make_draft(seed: int = 0) -> Eagle3Draft:
    torch.manual_seed(seed)
    draft = Eagle3Draft(DraftConfig(**CFG))
    draft.load_embeddings(torch.randn(100, 32))
    return draft.eval()


def test_parameter_names_and_shapes_follow_sglang() -> None:
    shapes = {k: tuple(v.shape) for k, v in make_draft().state_dict().items()}
    assert shapes["fc.weight"] == (32, 72)
    assert shapes["midlayer.self_attn.q_proj.weight"] == (32, 64)  # q/k/v read [embeds, hidden]: 2H
    assert shapes["midlayer.self_attn.k_proj.weight"] == (16, 64)
    assert shapes["midlayer.self_attn.o_proj.weight"] == (32, 32)
    assert shapes["midlayer.mlp.gate_proj.weight"] == (64, 32) and shapes["midlayer.mlp.down_proj.weight"] == (32, 64)
    for norm in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
        assert shapes[f"midlayer.{norm}.weight"] == (32,)
    assert shapes["norm.weight"] == (32,) and shapes["lm_head.weight"] == (50, 32)
    assert shapes["d2t"] == (50,) and shapes["t2d"] == (100,) and shapes["embed_tokens.weight"] == (100, 32)
    assert not make_draft().embed_tokens.weight.requires_grad


def test_fc_fuses_aux_states_and_is_skipped_for_draft_width_input() -> None:
    draft = make_draft()
    ids, aux = torch.randint(0, 100, (2, 6)), torch.randn(2, 6, 72)
    fused = draft(ids, aux)
    assert fused.logits.shape == (2, 6, 50) and fused.hidden.shape == (2, 6, 32)
    direct = draft(ids, draft.fc(aux))  # an H-wide hidden goes straight into the layer
    assert torch.allclose(direct.logits, fused.logits, atol=1e-5)
    with pytest.raises(ModelMismatchError, match="hidden width"):
        draft(ids, torch.randn(2, 6, 40))


def test_kv_cache_decoding_matches_the_full_forward() -> None:
    draft = make_draft()
    ids, aux = torch.randint(0, 100, (1, 9)), torch.randn(1, 9, 72)
    full = draft(ids, aux).logits
    cache = KVCache()
    first = draft(ids[:, :4], aux[:, :4], cache=cache).logits
    rest = [draft(ids[:, i : i + 1], aux[:, i : i + 1], cache=cache).logits for i in range(4, 9)]
    assert torch.allclose(torch.cat([first, *rest], 1), full, atol=1e-5)
    cache.crop(5)
    assert len(cache) == 5 and cache.position_offset() == 5


def test_ttt_steps_see_exactly_what_inference_drafting_sees() -> None:
    draft = make_draft()
    T = 10
    ids, aux = torch.randint(0, 100, (1, T + 3)), torch.randn(1, T, 72)
    ttt, hidden, steps = TTTCache(), aux, []
    for k in range(3):  # training: all origins at once, step k at positions t + k
        out = draft(ids[:, k : k + T], hidden, position_ids=torch.arange(T)[None] + k, cache=ttt)
        steps.append(out.logits)
        hidden = out.hidden
    origin = 6  # inference: prefix 0..origin from the target, then two drafted tokens
    cache = KVCache()
    out = draft(ids[:, : origin + 1], aux[:, : origin + 1], cache=cache)
    assert torch.allclose(out.logits[:, origin], steps[0][:, origin], atol=1e-5)
    hidden = out.hidden[:, origin:]
    for k in (1, 2):
        out = draft(ids[:, origin + k : origin + k + 1], hidden, cache=cache)
        hidden = out.hidden
        assert torch.allclose(out.logits[:, 0], steps[k][:, origin], atol=1e-5)


def test_draft_ids_map_to_target_ids() -> None:
    draft = make_draft()
    chosen = torch.tensor(sorted(torch.randperm(100)[:50].tolist()))
    t2d = torch.zeros(100, dtype=torch.bool)
    t2d[chosen] = True
    draft.set_vocab(chosen - torch.arange(50), t2d)
    assert torch.equal(draft.draft_to_target(torch.arange(50)), chosen)
    assert torch.equal(draft.draft_ids(), chosen)


def test_config_from_a_transformers_5_llama_config() -> None:
    target = {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
              "vocab_size": 128256, "rms_norm_eps": 1e-5, "max_position_embeddings": 131072,
              "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                  "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 8192}}
    cfg = DraftConfig.from_target_config(target, draft_vocab_size=32000, aux_layer_ids=[2, 16, 29])
    assert cfg.head_dim == 128 and cfg.rope_theta == 500000.0 and cfg.rope_scaling["rope_type"] == "llama3"
    assert cfg.fused_width == 3 * 4096 and cfg.aux_layer_ids == [2, 16, 29]
    assert DraftConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_target_head_reads_sharded_and_tied_checkpoints(tmp_path: Path) -> None:
    emb, head = torch.randn(20, 8), torch.randn(20, 8)
    save_file({"model.embed_tokens.weight": emb, "model.norm.weight": torch.ones(8)}, str(tmp_path / "a.safetensors"))
    save_file({"lm_head.weight": head}, str(tmp_path / "b.safetensors"))
    index = {"weight_map": {"model.embed_tokens.weight": "a.safetensors", "model.norm.weight": "a.safetensors",
                            "lm_head.weight": "b.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8, "vocab_size": 20}))
    assert torch.equal(load_lm_head(tmp_path), head) and torch.equal(load_embeddings(tmp_path), emb)
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8, "vocab_size": 20, "tie_word_embeddings": True}))
    assert torch.equal(TargetHead.from_pretrained(tmp_path).weight, emb)
    x = torch.randn(3, 8)
    assert torch.allclose(TargetHead(emb)(x), x @ emb.T)


def test_a_legacy_rope_type_key_is_read_as_the_engines_read_it() -> None:
    """`rope_scaling: {"type": "linear"}` (the key transformers still accepts, so the engines serve it
    linear) made eval's draft compute plain rope: the measurement was of another model."""
    from training.eagle3.layouts import layout_named

    config = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 64, "num_attention_heads": 4,
              "num_key_value_heads": 2, "intermediate_size": 128, "num_hidden_layers": 1, "vocab_size": 300,
              "draft_vocab_size": 48, "rope_scaling": {"type": "linear", "factor": 2.0},
              "curator": {"aux_layer_inputs": [2, 4, 5]}}
    cfg = layout_named("sglang").draft_config(config, None)
    assert cfg.rope_scaling == {"rope_type": "linear", "factor": 2.0}
