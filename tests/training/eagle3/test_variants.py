"""EAGLE-3.1's normalisations: in the draft as the engines place them, recorded by the run, refused on a
changed resume, exported with the keys each engine reads, and drafts of either layout trained further."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from tests.training.train.test_trainer import AUX_LAYERS, one_thread, sharp_target, store_dir, tiny_config  # noqa: F401  (fixtures)
from training.eagle3.model import DraftConfig, Eagle3Draft
from training.errors import ModelMismatchError, TrainingError
from training.export.export import export_checkpoint
from training.eagle3.load import load_draft
from training.train.checkpoint import latest_checkpoint, read_meta
from training.io.weights import read_weights
from training.train.config import TrainConfig
from training.train.trainer import train

EAGLE31 = {"norm_before_fc": True, "norm_output": True, "norm_before_residual": True}


def tiny_draft(**variant: bool) -> Eagle3Draft:
    torch.manual_seed(0)
    cfg = DraftConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                      vocab_size=100, draft_vocab_size=50, **variant)
    return Eagle3Draft(cfg).eval()


def same_weights(src: Eagle3Draft, dst: Eagle3Draft) -> Eagle3Draft:
    missing, unexpected = dst.load_state_dict(src.state_dict(), strict=False)
    assert not unexpected
    return dst


def file_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}


# ------------------------------------------------------------------ the draft


def test_norm_before_fc_makes_fc_blind_to_the_scale_of_the_aux_states() -> None:
    torch.manual_seed(1)
    ids, aux = torch.randint(0, 100, (1, 6)), torch.randn(1, 6, 96)
    plain, normed = tiny_draft(), tiny_draft(norm_before_fc=True)
    assert tuple(normed.input_norm.weight.shape) == (96,) and normed.fc_norm is None
    with torch.no_grad():
        assert torch.allclose(normed(ids, aux).logits, normed(ids, 50 * aux).logits, atol=1e-4)
        assert not torch.allclose(plain(ids, aux).logits, plain(ids, 50 * aux).logits, atol=1e-2)


def test_fc_norm_normalises_each_aux_state_on_its_own() -> None:
    torch.manual_seed(1)
    ids, aux = torch.randint(0, 100, (1, 6)), torch.randn(1, 6, 96)
    per_state = torch.cat([aux[..., :32] * 100, aux[..., 32:64], aux[..., 64:] * 3], dim=-1)
    fc_norm, once = tiny_draft(fc_norm=True), tiny_draft(norm_before_fc=True)
    assert [tuple(n.weight.shape) for n in fc_norm.fc_norm] == [(32,)] * 3 and fc_norm.input_norm is None
    with torch.no_grad():
        assert torch.allclose(fc_norm(ids, aux).logits, fc_norm(ids, per_state).logits, atol=1e-4)
        assert not torch.allclose(once(ids, aux).logits, once(ids, per_state).logits, atol=1e-2)


def test_norm_output_feeds_back_the_normed_hidden_and_keeps_the_logits() -> None:
    torch.manual_seed(1)
    ids, aux = torch.randint(0, 100, (1, 6)), torch.randn(1, 6, 96)
    plain = tiny_draft()
    fed = same_weights(plain, tiny_draft(norm_output=True))
    with torch.no_grad():
        a, b = plain(ids, aux), fed(ids, aux)
        assert torch.allclose(a.logits, b.logits)
        assert torch.allclose(b.hidden, plain.norm(a.hidden))  # the next step gets the post-norm state
        assert not torch.allclose(a.hidden, b.hidden)


def test_norm_before_residual_adds_the_normed_hidden() -> None:
    torch.manual_seed(1)
    ids = torch.randint(0, 100, (1, 6))
    plain = tiny_draft()
    nbr = same_weights(plain, tiny_draft(norm_before_residual=True))
    raw = torch.randn(1, 6, 32) * 7
    unit = raw / raw.pow(2).mean(-1, keepdim=True).add(1e-5).sqrt()  # already RMS 1: hidden_norm (weight 1) keeps it
    with torch.no_grad():
        assert not torch.allclose(plain(ids, raw).logits, nbr(ids, raw).logits, atol=1e-3)
        assert torch.allclose(plain(ids, unit).logits, nbr(ids, unit).logits, atol=1e-4)


def test_the_two_fc_norms_are_exclusive_and_an_older_config_is_plain_eagle3() -> None:
    with pytest.raises(ModelMismatchError, match="exclusive"):
        DraftConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, norm_before_fc=True, fc_norm=True)
    with pytest.raises(TrainingError, match="exclusive"):
        TrainConfig(norm_before_fc=True, fc_norm=True)
    old = DraftConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2).to_dict()
    for key in ("norm_before_fc", "fc_norm", "norm_before_residual", "norm_output"):
        old.pop(key)
    assert not any(DraftConfig.from_dict(old).variant().values())


# ------------------------------------------------------------------ training, resume, export


@pytest.fixture(scope="module")
def eagle31_run(store_dir: Path, sharp_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("e31-run") / "run"
    train(tiny_config(store_dir, sharp_target, out, max_steps=3, draft_vocab_size=64, eval_fraction=0.0, **EAGLE31))
    return out


@pytest.fixture(scope="module")
def fc_norm_run(store_dir: Path, sharp_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fcn-run") / "run"
    train(tiny_config(store_dir, sharp_target, out, max_steps=3, draft_vocab_size=64, eval_fraction=0.0,
                      fc_norm=True, norm_output=True))
    return out


@pytest.fixture(scope="module")
def plain_run(store_dir: Path, sharp_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("plain-run") / "run"
    train(tiny_config(store_dir, sharp_target, out, max_steps=2, draft_vocab_size=48, eval_fraction=0.0))
    return out


def test_the_run_records_its_norms_and_trains_their_weights(eagle31_run: Path) -> None:
    saved = json.loads((eagle31_run / "train_config.json").read_text())
    assert {k: saved[k] for k in EAGLE31} == EAGLE31 and saved["fc_norm"] is False
    ckpt = latest_checkpoint(eagle31_run)
    meta = read_meta(ckpt)
    assert {k: meta["draft_config"][k] for k in EAGLE31} == EAGLE31
    weights = read_weights(ckpt / "draft.safetensors")
    assert tuple(weights["input_norm.weight"].shape) == (3 * 64,)
    assert not torch.equal(weights["input_norm.weight"], torch.ones(3 * 64))  # trained, not left at 1


def test_resume_with_other_norms_is_refused_and_an_older_run_resumes(eagle31_run: Path, store_dir: Path,
                                                                     sharp_target: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(eagle31_run, run)
    changed = tiny_config(store_dir, sharp_target, run, max_steps=3, draft_vocab_size=64, eval_fraction=0.0,
                          **{**EAGLE31, "norm_output": False})
    with pytest.raises(TrainingError, match="norm_output: True -> False"):
        train(changed, resume=True)
    # a run from before the norm options existed: its train_config lacks them, which means off
    plain = tmp_path / "plain"
    train(tiny_config(store_dir, sharp_target, plain, max_steps=2, draft_vocab_size=64, eval_fraction=0.0))
    ckpt = latest_checkpoint(plain)
    meta = json.loads((ckpt / "meta.json").read_text())
    for key in ("norm_before_fc", "fc_norm", "norm_before_residual", "norm_output", "init_from"):
        meta["train_config"].pop(key)
    (ckpt / "meta.json").write_text(json.dumps(meta))
    result = train(tiny_config(store_dir, sharp_target, plain, max_steps=2, draft_vocab_size=64, eval_fraction=0.0),
                   resume=True)  # the finished run taken up, not refused
    assert result.step == 2


def test_both_layouts_carry_the_keys_and_weights_the_engines_read(fc_norm_run: Path, tmp_path: Path,
                                                                 sharp_target: Path) -> None:
    sg = export_checkpoint(fc_norm_run, tmp_path / "sg", fmt="sglang")
    spec = export_checkpoint(fc_norm_run, tmp_path / "spec", fmt="speculators", verifier="org/target")
    want = {"norm_before_fc": False, "fc_norm": True, "norm_before_residual": False, "norm_output": True}
    for export in (sg, spec):
        cfg = json.loads((export / "config.json").read_text())
        assert {k: cfg[k] for k in want} == want  # top level: what SGLang, vLLM and speculators read
        assert cfg["curator"]["variant"] == want
        shapes = file_shapes(export)
        assert [shapes[f"fc_norm.{i}.weight"] for i in range(3)] == [(64,)] * 3 and "input_norm.weight" not in shapes
        ours = load_draft(export, sharp_target)
        assert ours.config.variant() == want
    a, b = load_draft(sg, sharp_target).trainable_state_dict(), load_draft(spec, sharp_target).trainable_state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # the same draft, norms included


def test_the_sglang_layout_refuses_a_norm_sglang_does_not_build(eagle31_run: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelMismatchError, match=r"norm_before_residual.*SGLang 0\.5\.23.*--format speculators"):
        export_checkpoint(eagle31_run, tmp_path / "sg", fmt="sglang")
    assert not (tmp_path / "sg").exists()
    spec = export_checkpoint(eagle31_run, tmp_path / "spec", fmt="speculators", verifier="org/target")
    cfg = json.loads((spec / "config.json").read_text())
    assert cfg["norm_before_residual"] is True and cfg["norm_before_fc"] is True
    assert file_shapes(spec)["input_norm.weight"] == (3 * 64,)


# ------------------------------------------------------------------ drafts from elsewhere


@pytest.mark.parametrize("fmt", ["sglang", "speculators"])
@pytest.mark.parametrize("variant", ["plain", "fc_norm"])
def test_a_run_starts_from_an_exported_draft_in_either_layout(fmt: str, variant: str, fc_norm_run: Path,
                                                              plain_run: Path, store_dir: Path, sharp_target: Path,
                                                              tmp_path: Path) -> None:
    options = {"fc_norm": True, "norm_output": True} if variant == "fc_norm" else {}
    source = fc_norm_run if options else plain_run
    export = export_checkpoint(source, tmp_path / "published", fmt=fmt, verifier="org/target")
    published = load_draft(export, sharp_target)
    # lr 1e-30: the one step moves no weight by a float32 ulp, so the run's checkpoint is the published draft
    run = tmp_path / "adapted"
    train(tiny_config(store_dir, sharp_target, run, max_steps=1, lr=1e-30, eval_fraction=0.0, draft_vocab_size=512,
                      init_from=str(export), **options))
    ckpt = latest_checkpoint(run)
    weights = read_weights(ckpt / "draft.safetensors")
    for name, tensor in published.trainable_state_dict().items():
        assert torch.equal(weights[name].to(tensor.dtype), tensor), name
    meta = read_meta(ckpt)
    assert meta["draft_config"]["draft_vocab_size"] == published.config.draft_vocab_size  # its vocab, not 512
    assert json.loads((run / "vocab.json").read_text())["draft_ids"] == published.draft_ids().tolist()


def test_a_draft_from_elsewhere_with_other_norms_or_layers_is_refused(fc_norm_run: Path, store_dir: Path,
                                                                       sharp_target: Path, tmp_path: Path) -> None:
    export = export_checkpoint(fc_norm_run, tmp_path / "published", fmt="speculators", verifier="org/target")
    with pytest.raises(TrainingError, match="fc_norm=true norm_output=true"):
        train(tiny_config(store_dir, sharp_target, tmp_path / "a", max_steps=1, init_from=str(export)))
    cfg = json.loads((export / "config.json").read_text())
    cfg["eagle_aux_hidden_state_layer_ids"] = [i + 1 for i in cfg["eagle_aux_hidden_state_layer_ids"]]
    cfg["curator"].pop("aux_layer_inputs")
    (export / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelMismatchError, match=re.escape(f"the store holds {AUX_LAYERS}")):
        train(tiny_config(store_dir, sharp_target, tmp_path / "b", max_steps=1, init_from=str(export),
                          fc_norm=True, norm_output=True))
