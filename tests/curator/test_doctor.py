"""`curator doctor`: every misconfiguration that silently ruins acceptance is caught before serving."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from curator.cli import main
from curator.doctor import Check, DoctorReport, diagnose, parse_launch

H, HEADS, KV_HEADS, LAYERS, VOCAB, DRAFT_VOCAB = 64, 4, 2, 8, 300, 48
LAYER_IDS = [2, 4, 5]  # SGLang's default [2, N//2, N-3] for N=8


def write_target(root: Path, **overrides: object) -> Path:
    """A target model directory: only config.json matters to the doctor."""
    root.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "hidden_size": H, "num_attention_heads": HEADS,
              "num_key_value_heads": KV_HEADS, "num_hidden_layers": LAYERS, "vocab_size": VOCAB}
    config.update(overrides)
    (root / "config.json").write_text(json.dumps(config))
    return root


def draft_tensors(prefix: str, fc_in: int = 3 * H, draft_vocab: int = DRAFT_VOCAB,
                  d2t_shift: int = 0) -> dict[str, torch.Tensor]:
    """Small EAGLE-3 weights laid out as an export writes them (no embedding)."""
    head_dim = H // HEADS
    hot = torch.arange(0, 2 * draft_vocab, 2)  # every second target id is in the draft vocab
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[hot] = True
    layer = {
        "self_attn.q_proj.weight": torch.zeros(HEADS * head_dim, 2 * H),
        "self_attn.k_proj.weight": torch.zeros(KV_HEADS * head_dim, 2 * H),
        "self_attn.v_proj.weight": torch.zeros(KV_HEADS * head_dim, 2 * H),
        "self_attn.o_proj.weight": torch.zeros(H, HEADS * head_dim),
        "mlp.gate_proj.weight": torch.zeros(4 * H, H),
        "mlp.up_proj.weight": torch.zeros(4 * H, H),
        "mlp.down_proj.weight": torch.zeros(H, 4 * H),
        "input_layernorm.weight": torch.ones(H),
        "hidden_norm.weight": torch.ones(H),
        "post_attention_layernorm.weight": torch.ones(H),
    }
    tensors = {prefix + k: v for k, v in layer.items()}
    tensors.update({
        "fc.weight": torch.zeros(H, fc_in),
        "norm.weight": torch.ones(H),
        "lm_head.weight": torch.zeros(draft_vocab, H),
        "d2t": hot - torch.arange(draft_vocab) + d2t_shift,
        "t2d": t2d,
    })
    return tensors


def write_sglang_export(root: Path, *, config: dict | None = None, **tensor_kwargs) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": H,
           "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "intermediate_size": 4 * H,
           "num_hidden_layers": 1, "vocab_size": VOCAB, "draft_vocab_size": DRAFT_VOCAB,
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in LAYER_IDS]}}  # SGLang adds 1 (Llama)
    cfg.update(config or {})
    (root / "config.json").write_text(json.dumps(cfg))
    save_file(draft_tensors("midlayer.", **tensor_kwargs), str(root / "model.safetensors"))
    return root


def write_speculators_export(root: Path, prefix: str = "layers.0.", verifier: str = "org/target") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    cfg = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
           "transformer_layer_config": {"model_type": "llama", "hidden_size": H, "num_attention_heads": HEADS,
                                        "num_key_value_heads": KV_HEADS, "vocab_size": VOCAB,
                                        "intermediate_size": 4 * H, "num_hidden_layers": 1},
           "draft_vocab_size": DRAFT_VOCAB, "norm_before_residual": False,
           "eagle_aux_hidden_state_layer_ids": LAYER_IDS,
           "speculators_config": {"algorithm": "eagle3",
                                  "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                  "default_proposal_method": "greedy",
                                  "verifier": {"name_or_path": verifier, "architectures": ["LlamaForCausalLM"]}}}
    (root / "config.json").write_text(json.dumps(cfg))
    save_file(draft_tensors(prefix), str(root / "model.safetensors"))
    return root


def sglang_cmd(target: Path | str, draft: Path | str, algo: str = "EAGLE3", steps: int = 3, topk: int = 1, ndt: int = 4) -> str:
    return (f"python -m sglang.launch_server --model-path {target} --tp 8 --speculative-algorithm {algo} "
            f"--speculative-draft-model-path {draft} --speculative-num-steps {steps} "
            f"--speculative-eagle-topk {topk} --speculative-num-draft-tokens {ndt} --port 30000")


def vllm_cmd(target: Path, draft: Path, method: str = "eagle3") -> str:
    spec = json.dumps({"method": method, "model": str(draft), "num_speculative_tokens": 3})
    return f"vllm serve {target} --tensor-parallel-size 8 --speculative-config {shlex.quote(spec)}"


@pytest.fixture()
def target(tmp_path: Path) -> Path:
    return write_target(tmp_path / "target")


@pytest.fixture()
def good_draft(tmp_path: Path) -> Path:
    return write_sglang_export(tmp_path / "draft")


def test_correct_sglang_deployment_passes_every_check(target: Path, good_draft: Path) -> None:
    report = diagnose(good_draft, target, launch=sglang_cmd(target, good_draft))
    assert report.ok, [c for c in report.errors]
    assert not [c for c in report.checks if c.status == "warn"]
    assert {"architecture", "fc shape", "fc width vs target", "vocab size", "aux layers (SGLang)",
            "algorithm", "draft path", "draft steps"} <= {c.name for c in report.checks}


def test_correct_vllm_speculators_deployment_passes(tmp_path: Path, target: Path) -> None:
    draft = write_speculators_export(tmp_path / "spec")
    report = diagnose(draft, target, launch=vllm_cmd(target, draft))
    assert report.ok, report.errors
    assert report.launch_command.startswith("vllm serve")


# Each case: (what is wrong, how to break the draft dir, how to break the command, check that must fail).
Case = tuple[str, Callable[[Path], Path], Callable[[Path, Path], str], str]
CASES: list[Case] = [
    ("EAGLE instead of EAGLE3", lambda d: write_sglang_export(d),
     lambda t, d: sglang_cmd(t, d, algo="EAGLE"), "algorithm"),
    ("vLLM method eagle", lambda d: write_sglang_export(d),
     lambda t, d: vllm_cmd(t, d, method="eagle"), "algorithm"),
    ("fc for another target width", lambda d: write_sglang_export(d, fc_in=3 * 48, config={"target_hidden_size": 48}),
     lambda t, d: sglang_cmd(t, d), "fc width vs target"),
    ("fc that does not match its config", lambda d: write_sglang_export(d, fc_in=2 * H),
     lambda t, d: sglang_cmd(t, d), "fc shape"),
    ("vocab of another tokenizer", lambda d: write_sglang_export(d, config={"vocab_size": VOCAB + 2}),
     lambda t, d: sglang_cmd(t, d), "vocab size"),
    ("layer id past the target's depth",
     lambda d: write_sglang_export(d, config={"eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 4, LAYERS]}}),
     lambda t, d: sglang_cmd(t, d), "aux layers (SGLang)"),
    ("two layer ids only",
     lambda d: write_sglang_export(d, config={"eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 4]}}),
     lambda t, d: sglang_cmd(t, d), "aux layer ids"),
    ("wrong draft path", lambda d: write_sglang_export(d),
     lambda t, d: sglang_cmd(t, d.parent / "some-other-draft"), "draft path"),
    ("topk without steps (SGLang's start-up assertion)", lambda d: write_sglang_export(d),
     lambda t, d: sglang_cmd(t, d).replace("--speculative-num-steps 3 ", ""), "draft steps"),
    ("export trained on other layers than SGLang captures",
     lambda d: write_sglang_export(d, config={"curator": {"aux_layer_inputs": [1, 4, 5]}}),
     lambda t, d: sglang_cmd(t, d), "aux layers (SGLang)"),
    ("`vllm serve EXPORT` whose verifier is a local folder", lambda d: write_speculators_export(d, verifier="/models/t"),
     lambda t, d: f"vllm serve {d} --port 8000", "verifier"),
    ("vLLM short flag and the same key in --speculative-config", lambda d: write_speculators_export(d),
     lambda t, d: vllm_cmd(t, d) + " --spec-tokens 2", "speculative config"),
    ("tree larger than topk allows", lambda d: write_sglang_export(d),
     lambda t, d: sglang_cmd(t, d, steps=2, topk=2, ndt=9), "draft steps"),
    ("speculators layout served by SGLang", lambda d: write_speculators_export(d),
     lambda t, d: sglang_cmd(t, d), "layout vs server"),
    ("weights under the other layout's names", lambda d: write_speculators_export(d, prefix="midlayer."),
     lambda t, d: vllm_cmd(t, d), "weight names"),
    ("d2t pointing outside the target vocab", lambda d: write_sglang_export(d, d2t_shift=VOCAB),
     lambda t, d: sglang_cmd(t, d), "d2t/t2d"),
    ("lm_head not draft-vocab wide", lambda d: write_sglang_export(d, config={"draft_vocab_size": DRAFT_VOCAB + 1}),
     lambda t, d: sglang_cmd(t, d), "lm_head shape"),
    ("not an EAGLE-3 export", lambda d: write_sglang_export(d, config={"architectures": ["LlamaForCausalLM"]}),
     lambda t, d: sglang_cmd(t, d), "architecture"),
    ("server started on another target", lambda d: write_sglang_export(d),
     lambda t, d: sglang_cmd(t.parent / "other-model", d), "target model"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_each_misconfiguration_is_an_error(case: Case, tmp_path: Path, target: Path) -> None:
    _, make_draft, make_cmd, failing = case
    draft = make_draft(tmp_path / "draft")
    report = diagnose(draft, target, launch=make_cmd(target, draft))
    assert not report.ok
    assert failing in {c.name for c in report.errors}, [(c.name, c.detail) for c in report.errors]


def test_eagle_error_explains_the_silent_fc_bypass(target: Path, good_draft: Path) -> None:
    report = diagnose(good_draft, target, launch=sglang_cmd(target, good_draft, algo="EAGLE"))
    (algo,) = [c for c in report.errors if c.name == "algorithm"]
    assert "fc" in algo.detail and "silently" in algo.detail and "192" in algo.detail


def test_suggested_command_fixes_the_flags_and_keeps_the_rest(target: Path, good_draft: Path) -> None:
    bad = sglang_cmd(target, good_draft.parent / "elsewhere", algo="EAGLE", steps=5, topk=1, ndt=4)
    report = diagnose(good_draft, target, launch=bad)
    fixed = report.launch_command
    assert "--tp 8" in fixed and "--port 30000" in fixed
    assert "--speculative-algorithm EAGLE3" in fixed and str(good_draft) in fixed
    assert "--speculative-num-steps 5" in fixed and "--speculative-num-draft-tokens 6" in fixed
    assert diagnose(good_draft, target, launch=fixed).ok


def write_store(root: Path, layer_ids: list[int], convention: str = "sglang-input") -> Path:
    from training.storage.format import StoreMeta
    from training.storage.writer import StoreWriter

    meta = StoreMeta(target="target", hidden_size=H, num_layers=LAYERS, vocab_size=VOCAB, aux_layer_ids=layer_ids,
                     layer_convention=convention, dtype="bf16", has_final=False)
    with StoreWriter(root, meta):
        pass
    return root


def test_store_captured_at_other_layers_is_an_error(tmp_path: Path, target: Path, good_draft: Path) -> None:
    report = diagnose(good_draft, target, store=write_store(tmp_path / "store", [1, 4, 5]))
    assert "layer ids vs data" in {c.name for c in report.errors}


def test_store_recording_layer_outputs_matches_the_same_layers_as_inputs(tmp_path: Path, target: Path,
                                                                         good_draft: Path) -> None:
    # SpecForge's outputs of layers [1, 3, 4] are SGLang's inputs of layers [2, 4, 5]
    report = diagnose(good_draft, target, store=write_store(tmp_path / "store", [1, 3, 4], "output"))
    assert report.ok, report.errors


def test_launch_parsing_reads_equals_and_underscores() -> None:
    spec = parse_launch("CUDA_VISIBLE_DEVICES=0,1 python3 -m sglang.launch_server --model=/m "
                        "--speculative_algorithm=EAGLE3 --speculative-draft-model-path /d "
                        "--speculative-num-steps=2 --speculative-eagle-topk 1 --speculative-num-draft-tokens 3")
    assert (spec.engine, spec.target, spec.algorithm, spec.draft_path, spec.steps, spec.topk, spec.num_draft_tokens) \
        == ("sglang", "/m", "EAGLE3", "/d", 2, 1, 3)


def test_cli_exits_nonzero_and_prints_the_right_command(target: Path, good_draft: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["doctor", "--draft", str(good_draft), "--model", str(target),
                 "--launch", sglang_cmd(target, good_draft, algo="EAGLE")])
    out = capsys.readouterr()
    assert code == 1
    assert "EAGLE3" in out.out and "sglang.launch_server" in out.out
    assert main(["doctor", "--draft", str(good_draft), "--model", str(target),
                 "--launch", sglang_cmd(target, good_draft)]) == 0


def test_cli_reports_a_missing_draft_in_one_line(tmp_path: Path) -> None:
    assert main(["doctor", "--draft", str(tmp_path / "nope")]) == 1


def test_export_without_layer_ids_is_an_error_when_the_server_default_differs(tmp_path: Path, target: Path) -> None:
    draft = write_sglang_export(tmp_path / "draft", config={"eagle_config": None})
    report = diagnose(draft, target, store=write_store(tmp_path / "other", [1, 2, 3]))
    assert any(c.status == "error" and "default" in c.detail for c in report.checks)
    assert not report.ok
    same = diagnose(draft, target, store=write_store(tmp_path / "same", LAYER_IDS))
    assert not [c for c in same.checks if c.status == "error"]


def test_an_export_sglang_reads_as_trained_passes_and_says_which_layers(target: Path, tmp_path: Path) -> None:
    # Llama target: SGLang adds 1 to the written ids [1, 3, 4] and captures the inputs of [2, 4, 5]
    draft = write_sglang_export(tmp_path / "d", config={"curator": {"aux_layer_inputs": LAYER_IDS}})
    report = diagnose(draft, target, launch=sglang_cmd(target, draft))
    assert report.ok, report.errors
    (sg,) = [c for c in report.checks if c.name == "aux layers (SGLang)"]
    assert sg.status == "ok" and "[2, 4, 5]" in sg.detail and "plus-one" in sg.detail


def test_the_same_ids_under_a_deepseek_target_are_read_as_inputs(tmp_path: Path) -> None:
    # deepseek_v2 adds 1 only when the first id is 1: [1, 3, 4] -> [2, 4, 5], [2, 4, 5] -> as is
    target = write_target(tmp_path / "ds", architectures=["DeepseekV3ForCausalLM"])
    ok = write_sglang_export(tmp_path / "ok", config={"curator": {"aux_layer_inputs": LAYER_IDS}})
    assert diagnose(ok, target).ok
    off = write_sglang_export(tmp_path / "off", config={"curator": {"aux_layer_inputs": LAYER_IDS},
                                                         "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 3, 4]}})
    assert "aux layers (SGLang)" in {c.name for c in diagnose(off, target).errors}


def test_topk_one_with_other_draft_tokens_is_a_warning_because_sglang_adjusts_it(target: Path, good_draft: Path) -> None:
    report = diagnose(good_draft, target, launch=sglang_cmd(target, good_draft, steps=3, topk=1, ndt=8))
    assert report.ok
    (steps,) = [c for c in report.checks if c.name == "draft steps"]
    assert steps.status == "warn" and "adjusts" in steps.detail


def test_vllm_short_flags_are_read_and_kept_in_the_suggestion(tmp_path: Path, target: Path) -> None:
    draft = write_speculators_export(tmp_path / "spec")
    cmd = f"vllm serve {target} --spec-method eagle3 --spec-model {draft} --spec-tokens 3 --port 8000"
    spec = parse_launch(cmd)
    assert (spec.algorithm, spec.draft_path, spec.steps) == ("eagle3", str(draft), 3)
    report = diagnose(draft, target, launch=cmd)
    assert report.ok, report.errors
    assert "--speculative-config" not in report.launch_command and "--spec-tokens 3" in report.launch_command
    json_cmd = f"vllm serve {target} -sc '{{\"method\": \"eagle3\", \"model\": \"{draft}\", \"num_speculative_tokens\": 2}}'"
    assert parse_launch(json_cmd).steps == 2 and diagnose(draft, target, launch=json_cmd).ok


def test_vllm_serving_an_sglang_export_without_top_level_ids_is_an_error(target: Path, good_draft: Path) -> None:
    report = diagnose(good_draft, target, launch=vllm_cmd(target, good_draft))
    assert "layout vs server" in {c.name for c in report.errors}
    fixed = write_sglang_export(good_draft.parent / "fixed", config={"eagle_aux_hidden_state_layer_ids": LAYER_IDS})
    assert diagnose(fixed, target, launch=vllm_cmd(target, fixed)).ok


def test_a_local_verifier_is_flagged_even_without_a_launch_command(tmp_path: Path, target: Path) -> None:
    report = diagnose(write_speculators_export(tmp_path / "spec", verifier=str(target)), target)
    (verifier,) = [c for c in report.checks if c.name == "verifier"]
    assert verifier.status == "warn" and "--verifier" in verifier.detail


def test_vllm_serve_export_is_a_complete_launch(tmp_path: Path, target: Path) -> None:
    # vLLM 0.33 takes the method, the draft and the token count from the export and serves its verifier
    draft = write_speculators_export(tmp_path / "spec")
    report = diagnose(draft, target, launch=f"vllm serve {draft} --port 8000")
    assert report.ok, [(c.name, c.detail) for c in report.errors]
    checks = {c.name: c for c in report.checks}
    assert checks["launch form"].status == "ok" and "org/target" in checks["launch form"].detail
    assert checks["draft steps"].detail.startswith("3 tokens")
    assert checks["target model"].status == "warn" and "from the Hub" in checks["target model"].detail
    assert shlex.split(report.launch_command) == ["vllm", "serve", str(draft), "--port", "8000"]


def test_vllm_serve_export_keeps_the_users_token_count_and_warns_on_locked_fields(tmp_path: Path) -> None:
    draft = write_speculators_export(tmp_path / "spec")
    own = json.dumps({"method": "eagle", "num_speculative_tokens": 5})
    report = diagnose(draft, launch=f"vllm serve {draft} -sc {shlex.quote(own)}")
    assert report.ok, report.errors
    checks = {c.name: c for c in report.checks}
    assert checks["algorithm"].detail == "eagle3" and checks["draft steps"].detail.startswith("5 tokens")
    assert checks["speculative config"].status == "warn" and "'eagle' is ignored" in checks["speculative config"].detail
    fixed = shlex.split(report.launch_command)
    assert fixed[:3] == ["vllm", "serve", str(draft)] and json.loads(fixed[-1]) == {"num_speculative_tokens": 5}


def test_vllm_serve_export_without_proposal_methods_is_refused(tmp_path: Path) -> None:
    draft = write_speculators_export(tmp_path / "spec")
    config = json.loads((draft / "config.json").read_text())
    del config["speculators_config"]["proposal_methods"]
    (draft / "config.json").write_text(json.dumps(config))
    report = diagnose(draft, launch=f"vllm serve {draft}")
    assert "speculators config" in {c.name for c in report.errors}


def test_vllm_serve_export_with_a_local_verifier_suggests_serving_it_explicitly(tmp_path: Path) -> None:
    draft = write_speculators_export(tmp_path / "spec", verifier="/models/t")
    report = diagnose(draft, launch=f"vllm serve {draft} --port 8000")
    assert "verifier" in {c.name for c in report.errors}
    fixed = shlex.split(report.launch_command)
    assert fixed[:3] == ["vllm", "serve", "/models/t"] and "--port" in fixed
    assert json.loads(fixed[-1]) == {"method": "eagle3", "model": str(draft), "num_speculative_tokens": 3}


def test_vllm_serve_export_refuses_short_flags_and_keeps_other_speculative_keys(tmp_path: Path) -> None:
    # vLLM 0.33 fills method/model/tokens from the export first, then refuses --spec-* as duplicates
    draft = write_speculators_export(tmp_path / "spec")
    report = diagnose(draft, launch=f"vllm serve {draft} --spec-tokens 5")
    assert "speculative config" in {c.name for c in report.errors}
    own = json.dumps({"model": "/elsewhere", "attention_backend": "FLASH_ATTN"})
    report = diagnose(draft, launch=f"vllm serve {draft} --tokenizer /tok -sc {shlex.quote(own)}")
    assert report.ok and {c.name: c.status for c in report.checks}["tokenizer"] == "warn"
    fixed = shlex.split(report.launch_command)
    assert "--tokenizer" not in fixed and json.loads(fixed[-1]) == {"attention_backend": "FLASH_ATTN"}


def test_vllm_serve_export_takes_a_bare_hub_id_as_vllm_does(tmp_path: Path) -> None:
    draft = write_speculators_export(tmp_path / "spec", verifier="gpt2")  # huggingface_hub's validate_repo_id passes it
    report = diagnose(draft, launch=f"vllm serve {draft}")
    assert "verifier" not in {c.name for c in report.checks}


def named(report: DoctorReport, name: str) -> list[Check]:
    return [c for c in report.checks if c.name == name]


def test_a_glm5_target_is_judged_by_deepseeks_rule_not_plus_one(tmp_path: Path) -> None:
    # SGLang 0.5.23's GlmMoeDsaForCausalLM inherits DeepSeek's rule: ids not starting at 1 are kept as they are
    target = write_target(tmp_path / "glm5", architectures=["GlmMoeDsaForCausalLM"])
    trained = {"aux_layer_inputs": [3, 5, 6]}
    right = write_sglang_export(tmp_path / "right", config={"eagle_config": {"eagle_aux_hidden_state_layer_ids": [3, 5, 6]},
                                                           "curator": trained})
    assert [c.status for c in named(diagnose(right, target), "aux layers (SGLang)")] == ["ok"]
    # what the old export wrote for it (one lower, as for Llama): SGLang serves layers [2, 4, 5]
    old = write_sglang_export(tmp_path / "old", config={"eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 4, 5]},
                                                       "curator": trained})
    [check] = named(diagnose(old, target), "aux layers (SGLang)")
    assert check.status == "error" and "[2, 4, 5]" in check.detail


def test_a_target_class_sglang_does_not_know_is_an_error_not_an_assumption(tmp_path: Path, good_draft: Path) -> None:
    target = write_target(tmp_path / "new", architectures=["BrandNewForCausalLM"])
    report = diagnose(good_draft, target, launch=sglang_cmd(target, good_draft))
    [check] = named(report, "aux layers served")
    assert check.status == "error" and "not in SGLang 0.5.23's model registry" in check.detail
    assert not report.ok


def test_a_diverged_draft_is_not_ready_to_serve(tmp_path: Path, target: Path) -> None:
    draft = write_sglang_export(tmp_path / "nan")
    from safetensors.torch import load_file

    tensors = load_file(str(draft / "model.safetensors"))
    tensors["fc.weight"][0, 0] = float("nan")
    save_file(tensors, str(draft / "model.safetensors"))
    report = diagnose(draft, target, launch=sglang_cmd(target, draft))
    [check] = named(report, "weight values")
    assert check.status == "error" and "fc.weight" in check.detail and not report.ok


def test_a_draft_on_four_layers_with_its_count_written_passes(tmp_path: Path, target: Path) -> None:
    draft = write_sglang_export(tmp_path / "four", fc_in=4 * H, config={
        "num_aux_hidden_states": 4, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3, 4]},
        "eagle_aux_hidden_state_layer_ids": [2, 3, 4, 5], "curator": {"aux_layer_inputs": [2, 3, 4, 5]}})
    report = diagnose(draft, target, launch=sglang_cmd(target, draft))
    assert report.ok, [c for c in report.checks if c.status == "error"]


def test_vllm_method_eagle_says_what_vllm_does(tmp_path: Path, target: Path) -> None:
    """vLLM 0.32 refuses `"method": "eagle"` on an EAGLE-3 export at start-up (tests/serving/
    test_served_doctor.py starts it): the doctor says so, not SGLang's silent fc bypass."""
    draft = write_sglang_export(tmp_path / "d")
    report = diagnose(draft, target, launch=vllm_cmd(target, draft, method="eagle"))
    algorithm = next(c for c in report.errors if c.name == "algorithm")
    assert "refuses to start" in algorithm.detail and "fc is silently skipped" not in algorithm.detail


def test_a_vllm_launch_makes_vllms_layer_mismatch_an_error(tmp_path: Path, target: Path) -> None:
    """An SGLang-layout export whose top-level ids (what vLLM reads first) are not the trained layers:
    vLLM 0.32 serves it silently at a lower acceptance (tests/serving/test_served_doctor.py), so on a
    vLLM launch the doctor refuses it; SGLang, which reads eagle_config's ids, only gets a warning."""
    draft = write_sglang_export(tmp_path / "d", config={"eagle_aux_hidden_state_layer_ids": [i - 1 for i in LAYER_IDS],
                                                        "curator": {"aux_layer_inputs": LAYER_IDS}})
    on_vllm = {c.name: c for c in diagnose(draft, target, launch=vllm_cmd(target, draft)).checks}
    assert on_vllm["aux layers (vLLM)"].status == "error"
    on_sglang = {c.name: c for c in diagnose(draft, target, launch=sglang_cmd(target, draft)).checks}
    assert on_sglang["aux layers (vLLM)"].status == "warn" and on_sglang["aux layers (SGLang)"].status == "ok"


@pytest.mark.parametrize("written", ["--api-key {k}", "--api_key={k}", "--hf-token {k}", "--admin-api-key {k}"])
def test_the_doctor_never_echoes_a_launch_commands_credentials(
    target: Path, good_draft: Path, tmp_path: Path, written: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The doctor once printed `--api-key VALUE` back in the command to copy (issue 38 item 5)."""
    key = "launch-key-Zq81x"
    for launch in (sglang_cmd(target, good_draft, algo="EAGLE") + " " + written.format(k=key),
                   vllm_cmd(target, good_draft) + " " + written.format(k=key),
                   f"vllm serve {write_speculators_export(tmp_path / 'spec')} " + written.format(k=key)):
        main(["doctor", "--draft", str(good_draft), "--model", str(target), "--launch", launch])
        out = capsys.readouterr()
        assert key not in out.out + out.err, launch
        assert written.split()[0].split("=")[0] in out.out and "[REDACTED]" in out.out  # the flag kept, to fill in


@pytest.mark.parametrize("where", ["draft", "target", "flag"])
def test_the_doctor_never_echoes_a_urls_password(
    target: Path, good_draft: Path, where: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A `user:pw@` URL in a --launch value was echoed in the table and the command to copy (issue 49 item 1)."""
    url = "http://user:pw-Zq81x@host:5000/m"
    launch = {"draft": sglang_cmd(target, url), "target": sglang_cmd(url, good_draft),
              "flag": sglang_cmd(target, good_draft, algo="EAGLE") + f" --dist-init-addr {url}"}[where]
    main(["doctor", "--draft", str(good_draft), "--model", str(target), "--launch", launch])
    out = capsys.readouterr()
    assert "pw-Zq81x" not in out.out + out.err and "user:" not in out.out + out.err
    report = diagnose(good_draft, target, launch=launch)
    assert not any("pw-Zq81x" in c.detail for c in report.checks) and "pw-Zq81x" not in report.launch_command
    if where == "flag":  # the flag and its host stay in the command to copy
        assert "--dist-init-addr http://host:5000/m" in out.out


@pytest.mark.parametrize("field", ["num_hidden_layers", "hidden_size", "vocab_size"])
def test_a_target_with_impossible_sizes_is_never_ready_to_serve(tmp_path: Path, good_draft: Path, field: str) -> None:
    """`num_hidden_layers: -1` once got "ready to serve" (issue 38 item 10)."""
    bad = write_target(tmp_path / "bad", **{field: -1})
    report = diagnose(good_draft, bad)
    assert not report.ok and any(c.name == "target config" and "-1" in c.detail for c in report.errors)
    assert main(["doctor", "--draft", str(good_draft), "--model", str(bad)]) == 1


@pytest.mark.parametrize("record", ["a string", ["a", "list"], 7])
def test_a_provenance_record_that_is_not_an_object_is_read_as_a_draft_from_elsewhere(
        record: object, target: Path, good_draft: Path) -> None:
    # A hand-edited or foreign config's "curator" key is untrusted: it must not crash the doctor
    # (it did: `.get` on a string), only make the draft one with no record of its training.
    config_path = good_draft / "config.json"
    config = json.loads(config_path.read_text())
    config["curator"] = record
    config_path.write_text(json.dumps(config))
    report = diagnose(good_draft, target, launch=sglang_cmd(target, good_draft))
    assert {"architecture", "fc shape", "vocab size"} <= {c.name for c in report.checks}


def test_the_draft_is_read_through_its_layout_not_by_key(tmp_path: Path) -> None:
    """The doctor and the launch checks read an export's fields through DraftLayout: a speculators
    export's verifier, heads and target width come from where that layout keeps them."""
    from curator.engines.draft import read_draft

    spec = read_draft(write_speculators_export(tmp_path / "spec", verifier="org/verifier"))
    assert (spec.fmt, spec.verifier) == ("speculators", "org/verifier")
    assert spec.num_attention_heads == spec.decoder_config["num_attention_heads"]
    sgl = read_draft(write_sglang_export(tmp_path / "sgl", config={"architectures": "LlamaForCausalLMEagle3"}))
    assert sgl.verifier is None and sgl.architectures == []  # not a list: nothing to name, no crash


@pytest.mark.parametrize("value", [-1, 0, 1000000, "x", 1.5, True])
@pytest.mark.parametrize("fmt", ["sglang", "speculators"])
def test_a_draft_whose_layer_count_no_engine_serves_is_never_ready(
        tmp_path: Path, target: Path, fmt: str, value: object) -> None:
    """num_hidden_layers -1, 0, 1000000, "x" and 1.5 once got "ready to serve" (sweep item 5): SGLang 0.5.23's
    LlamaForCausalLMEagle3 raises unless it is 1; vLLM builds that many layers and the export carries one."""
    draft = write_sglang_export(tmp_path / "d") if fmt == "sglang" else write_speculators_export(tmp_path / "d")
    config = json.loads((draft / "config.json").read_text())
    (config if fmt == "sglang" else config["transformer_layer_config"])["num_hidden_layers"] = value
    (draft / "config.json").write_text(json.dumps(config))
    report = diagnose(draft, target)
    details = [c.detail for c in report.errors if c.name == f"{fmt} config"]
    assert details and all("num_hidden_layers" in d for d in details), report.errors
    if value == 1000000:  # a count each engine would build: the error names the engine and its rule
        assert any("vLLM" in d and "decoder layers" in d for d in details)
        assert ("SGLang" in " ".join(details)) == (fmt == "sglang")
        assert fmt != "sglang" or any("only supports 1 layer" in d for d in details)
    assert main(["doctor", "--draft", str(draft), "--model", str(target)]) == 1


@pytest.mark.parametrize("value", [100000, 0, -3, "3", 4])
def test_an_aux_state_count_the_engines_do_not_capture_is_an_error(
        tmp_path: Path, target: Path, value: object) -> None:
    """num_aux_hidden_states 100000 (sweep item 5): fc would be built for states the engine never captures."""
    draft = write_sglang_export(tmp_path / "d", config={"num_aux_hidden_states": value})
    report = diagnose(draft, target)
    assert any(c.name == "sglang config" and "num_aux_hidden_states" in c.detail for c in report.errors), report.errors
    assert main(["doctor", "--draft", str(draft), "--model", str(target)]) == 1


def test_a_draft_with_the_aux_count_it_captures_stays_ready(tmp_path: Path, target: Path) -> None:
    draft = write_sglang_export(tmp_path / "d", config={"num_aux_hidden_states": 3})
    assert diagnose(draft, target).ok


def test_load_draft_refuses_a_layer_count_no_engine_serves(tmp_path: Path) -> None:
    """eval ran with num_hidden_layers 1000000 (sweep item 5): load_draft refuses what the engines refuse."""
    from training.eagle3.load import load_draft
    from training.errors import ModelMismatchError

    draft = write_sglang_export(tmp_path / "d", config={"num_hidden_layers": 1000000})
    with pytest.raises(ModelMismatchError, match="num_hidden_layers=1000000"):
        load_draft(draft)


HOSTILE_JSON = {"a 5,000-digit integer": '{"hidden_size": ' + "9" * 5000 + "}",
                "nesting 100K deep": "[" * 100_000 + "]" * 100_000}


@pytest.mark.parametrize("text", HOSTILE_JSON.values(), ids=HOSTILE_JSON.keys())
@pytest.mark.parametrize("whose", ["draft", "target"])
def test_a_config_json_python_cannot_parse_is_a_named_refusal(
        tmp_path: Path, target: Path, good_draft: Path, text: str, whose: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Both once ended in "unexpected ValueError/RecursionError ... please report it" (issue 49 item 8)."""
    from training.eagle3.load import load_draft
    from training.errors import TrainingError

    (good_draft if whose == "draft" else target).joinpath("config.json").write_text(text)
    assert main(["doctor", "--draft", str(good_draft), "--model", str(target)]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "config.json is not valid JSON" in err and "unexpected" not in err and "report" not in err, err
    with pytest.raises(TrainingError, match="config.json is not valid JSON"):  # what `curator eval` loads first
        load_draft(good_draft, target)


def _int8(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: (v.to(torch.int8) if v.is_floating_point() else v) for k, v in tensors.items()}


BROKEN_DRAFTS: dict[str, tuple[dict, Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None, str]] = {
    "heads that do not divide the width": ({"num_attention_heads": 3, "num_key_value_heads": 1}, None, "not divisible"),
    "kv heads that do not divide the heads": ({"num_key_value_heads": 3}, None, "not a multiple"),
    "a yarn factor of 1e30": ({"rope_scaling": {"rope_type": "yarn", "factor": 1e30}}, None, "factor 1e+30"),
    "a linear factor of 1e30": ({"rope_scaling": {"rope_type": "linear", "factor": 1e30}}, None, "factor 1e+30"),
    "rms_norm_eps NaN": ({"rms_norm_eps": float("nan")}, None, "rms_norm_eps=nan"),
    "torch_dtype evil": ({"torch_dtype": "evil"}, None, "torch_dtype='evil'"),
    "max_position_embeddings -1": ({"max_position_embeddings": -1}, None, "max_position_embeddings=-1"),
    "a 4,000-digit hidden size": ({"hidden_size": 10 ** 4000}, None, "hidden_size=1000"),
    "an extra tensor": ({}, lambda t: {**t, "extra.weight": torch.zeros(3)}, "extra.weight"),
    "int8 weights": ({}, _int8, "fc.weight I8"),
    "a norm the heads do not fit": ({}, lambda t: {**t, "midlayer.hidden_norm.weight": torch.ones(H + 1)}, "hidden_norm"),
}


@pytest.mark.parametrize("case", BROKEN_DRAFTS.values(), ids=BROKEN_DRAFTS.keys())
def test_the_doctor_refuses_what_eval_refuses_with_the_same_words(
        tmp_path: Path, target: Path, case: tuple[dict, Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None, str]) -> None:
    """Each got "ready to serve" while eval refused it or ran at acceptance 1.0 (issue 49 item 7): the
    doctor and load_draft now ask one check (training/eagle3/config_check.py)."""
    from training.eagle3.load import load_draft
    from training.errors import ModelMismatchError

    config, tensors, said = case
    draft = write_sglang_export(tmp_path / "d", config=config)
    if tensors is not None:
        save_file(tensors(draft_tensors("midlayer.")), str(draft / "model.safetensors"))
    report = diagnose(draft, target)
    shared = [c.detail for c in report.errors if c.name in ("sglang config", "tensors")]
    assert any(said in d for d in shared), report.errors
    with pytest.raises(ModelMismatchError) as refused:
        load_draft(draft, target)
    assert all(d in str(refused.value) for d in shared), (shared, str(refused.value))
    assert main(["doctor", "--draft", str(draft), "--model", str(target)]) == 1


def test_a_yarn_draft_is_served_but_said_to_be_beyond_eval(tmp_path: Path, target: Path) -> None:
    """The engines build yarn; the toolkit's draft does not: a warning, not a refusal to serve."""
    draft = write_sglang_export(tmp_path / "d", config={"rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    report = diagnose(draft, target)
    assert report.ok and [c.status for c in report.checks if c.name == "rope"] == ["warn"]


@pytest.mark.parametrize("text", HOSTILE_JSON.values(), ids=HOSTILE_JSON.keys())
def test_a_speculative_config_python_cannot_parse_is_a_check_not_a_crash(text: str) -> None:
    spec = parse_launch(f"vllm serve /t --speculative-config {shlex.quote(text)}")
    assert [c.name for c in spec.problems] == ["speculative config"] and "not JSON" in spec.problems[0].detail
