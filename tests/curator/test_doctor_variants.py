"""The doctor on EAGLE-3.1 drafts from elsewhere (built here in both layouts): each engine that would build
other norms than the draft was trained with is named, with its version, as an error."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from curator.doctor import diagnose
from tests.curator.test_doctor import H, write_sglang_export, write_speculators_export, write_target


def norm_checks(report) -> dict[str, tuple[str, str]]:
    return {c.name: (c.status, c.detail) for c in report.checks if c.name.startswith("norms")}


def with_config(root: Path, **keys: object) -> Path:
    cfg = json.loads((root / "config.json").read_text())
    cfg.update(keys)
    (root / "config.json").write_text(json.dumps(cfg))
    return root


def with_tensors(root: Path, **tensors: torch.Tensor) -> Path:
    weights = load_file(str(root / "model.safetensors"))
    weights.update(tensors)
    save_file(weights, str(root / "model.safetensors"))
    return root


def test_an_eagle31_speculators_draft_is_read_as_trained_by_vllm_and_speculators(tmp_path: Path) -> None:
    draft = with_config(write_speculators_export(tmp_path / "spec"), norm_before_fc=True, norm_output=True,
                        norm_before_residual=True)
    with_tensors(draft, **{"input_norm.weight": torch.ones(3 * H)})
    report = diagnose(draft, write_target(tmp_path / "target"))
    checks = norm_checks(report)
    assert set(checks) == {"norms (vLLM)", "norms (speculators)"}
    assert all(status == "ok" for status, _ in checks.values()), checks
    assert "norm_before_fc, norm_before_residual, norm_output" in checks["norms (vLLM)"][1]


def test_a_speculators_draft_without_norm_before_residual_is_misread_by_vllm(tmp_path: Path) -> None:
    draft = write_speculators_export(tmp_path / "spec")
    cfg = json.loads((draft / "config.json").read_text())
    cfg.pop("norm_before_residual")
    (draft / "config.json").write_text(json.dumps(cfg))
    checks = norm_checks(diagnose(draft))
    assert checks["norms (speculators)"][0] == "ok"  # speculators 0.9.0: absent means false
    status, detail = checks["norms (vLLM)"]
    assert status == "error" and "vLLM 0.33" in detail and "norm_before_residual: builds true, trained false" in detail


def test_an_sglang_layout_draft_with_norm_before_residual_is_an_error_for_sglang_only(tmp_path: Path) -> None:
    draft = with_config(write_sglang_export(tmp_path / "sg"), norm_before_residual=True)
    checks = norm_checks(diagnose(draft))
    # the key says how the draft was trained (vLLM builds it); SGLang 0.5.23 has no such norm
    assert checks["norms (vLLM)"][0] == "ok"
    status, detail = checks["norms (SGLang)"]
    assert status == "error" and "SGLang 0.5.23" in detail and "norm_before_residual: builds false, trained true" in detail
    assert "--format speculators" in detail


def test_sglangs_legacy_per_state_norms_are_read_by_sglang_and_not_by_vllm(tmp_path: Path) -> None:
    draft = with_config(write_sglang_export(tmp_path / "sg"), use_aux_norm=True)
    with_tensors(draft, **{f"aux_norm_{n}.weight": torch.ones(H) for n in ("low", "mid", "high")})
    checks = norm_checks(diagnose(draft))
    assert checks["norms (SGLang)"][0] == "ok", checks
    status, detail = checks["norms (vLLM)"]
    assert status == "error" and "fc_norm: builds false, trained true" in detail


def test_a_norm_weight_an_engine_would_skip_is_an_error_naming_it(tmp_path: Path) -> None:
    # input_norm.weight in the file, no norm_before_fc in the config: both engines drop the weight silently
    draft = with_tensors(write_sglang_export(tmp_path / "sg"), **{"input_norm.weight": torch.ones(3 * H)})
    checks = norm_checks(diagnose(draft))
    for engine in ("norms (SGLang)", "norms (vLLM)"):
        status, detail = checks[engine]
        assert status == "error" and "norm_before_fc: builds false, trained true" in detail
        assert "skipping input_norm.weight" in detail
    assert "SGLang 0.5.23" in checks["norms (SGLang)"][1]


def test_a_norm_turned_on_without_its_weights_is_an_error(tmp_path: Path) -> None:
    draft = with_config(write_sglang_export(tmp_path / "sg"), fc_norm=True)
    checks = norm_checks(diagnose(draft))
    assert checks["norms"][0] == "error" and "fc_norm.0.weight" in checks["norms"][1]


def test_nvidia_style_eagle_config_keys_are_read_where_the_engines_read_them(tmp_path: Path) -> None:
    # SGLang and vLLM read norm_before_fc from eagle_config first (vLLM's #42143): an NVIDIA-style draft
    draft = write_sglang_export(tmp_path / "sg", config={"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 4],
                                                                          "norm_before_fc": True}})
    with_tensors(draft, **{"input_norm.weight": torch.ones(3 * H)})
    checks = norm_checks(diagnose(draft))
    assert checks["norms (SGLang)"][0] == "ok" and checks["norms (vLLM)"][0] == "ok", checks
