"""Export: the SGLang and speculators layouts carry the right keys, shapes and layer ids, and load back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from tests.training.train.test_trainer import AUX_LAYERS, one_thread, sharp_target, store_dir, tiny_config  # noqa: F401  (fixtures)
from training.errors import TrainingError
from training.export.export import export_checkpoint
from training.eagle3.load import load_draft
from training.train.checkpoint import load_checkpoint_draft
from training.train.trainer import train

LAYER = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
         "mlp.up_proj", "mlp.down_proj", "input_layernorm", "hidden_norm", "post_attention_layernorm"]


@pytest.fixture(scope="module")
def run_dir(store_dir: Path, sharp_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("export-run") / "run"
    torch.set_num_threads(1)
    train(tiny_config(store_dir, sharp_target, out, max_steps=2, draft_vocab_size=64, eval_fraction=0.0))
    return out


def shapes(path: Path) -> dict[str, tuple[int, ...]]:
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}


def test_sglang_export_has_the_layout_sglang_loads(run_dir: Path, tmp_path: Path) -> None:
    out = export_checkpoint(run_dir, tmp_path / "sglang", fmt="sglang")
    cfg = json.loads((out / "config.json").read_text())
    got = shapes(out)
    H, V = 64, cfg["vocab_size"]
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["draft_vocab_size"] == 64 and cfg["num_hidden_layers"] == 1 and cfg["hidden_size"] == H
    # SGLang adds 1 to a Llama target's ids (they are layer outputs there): inputs [1, 2, 3] are written [0, 1, 2]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [i - 1 for i in AUX_LAYERS]
    assert cfg["curator"]["aux_layer_inputs"] == AUX_LAYERS
    # vLLM serving this layout reads the top-level key first, as layer inputs
    assert cfg["eagle_aux_hidden_state_layer_ids"] == AUX_LAYERS
    assert set(got) == {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} | {
        f"midlayer.{name}.weight" for name in LAYER}
    assert got["fc.weight"] == (H, 3 * H) and got["lm_head.weight"] == (64, H) and got["d2t"] == (64,)
    assert got["t2d"] == (V,) and got["midlayer.self_attn.q_proj.weight"] == (4 * 16, 2 * H)
    assert not any("embed" in k for k in got)  # the server shares the target's embeddings


def test_speculators_export_renames_the_layer_and_names_the_verifier(run_dir: Path, tmp_path: Path) -> None:
    out = export_checkpoint(run_dir, tmp_path / "spec", fmt="speculators")
    cfg = json.loads((out / "config.json").read_text())
    got = shapes(out)
    assert cfg["architectures"] == ["Eagle3Speculator"] and cfg["speculators_model_type"] == "eagle3"
    assert cfg["transformer_layer_config"]["hidden_size"] == 64 and cfg["draft_vocab_size"] == 64
    assert cfg["eagle_aux_hidden_state_layer_ids"] == AUX_LAYERS
    assert cfg["speculators_config"]["algorithm"] == "eagle3"
    assert cfg["speculators_config"]["verifier"]["architectures"] == ["LlamaForCausalLM"]
    assert {f"layers.0.{name}.weight" for name in LAYER} <= set(got)
    assert not any(k.startswith("midlayer.") for k in got) and {"d2t", "t2d"} <= set(got)
    # speculators' loader leaves a missing embedding uninitialised: the export carries the target's
    assert got["embed_tokens.weight"] == (cfg["transformer_layer_config"]["vocab_size"], 64)


@pytest.mark.parametrize("fmt", ["sglang", "speculators"])
def test_exported_draft_loads_back_and_predicts_the_same(run_dir: Path, sharp_target: Path, tmp_path: Path, fmt: str) -> None:
    trained, _ = load_checkpoint_draft(run_dir)
    loaded = load_draft(export_checkpoint(run_dir, tmp_path / fmt, fmt=fmt), target_dir=sharp_target)
    ids = torch.randint(0, trained.config.vocab_size, (1, 12))
    aux = torch.randn(1, 12, 3 * 64)
    with torch.no_grad():
        a, b = trained(ids, aux).logits, loaded(ids, aux).logits
    assert torch.equal(trained.d2t, loaded.d2t) and torch.equal(trained.t2d, loaded.t2d)
    assert (a - b).abs().max() <= 0.05 * a.abs().max()  # bf16 weights in the export
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() > 0.9


def test_checkpoint_with_incomplete_metadata_is_refused(run_dir: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    ckpt = next((run_dir / "checkpoints").glob("step-*"))
    broken.mkdir()
    for f in ckpt.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    meta = json.loads((broken / "meta.json").read_text())
    del meta["draft_config"]["aux_layer_ids"]
    (broken / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(TrainingError, match="aux_layer_ids"):
        export_checkpoint(broken, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_curator_export_writes_the_chosen_layout(run_dir: Path, tmp_path: Path) -> None:
    from curator.cli import main

    assert main(["export", "--checkpoint", str(run_dir), "--format", "speculators", "--out", str(tmp_path / "d")]) == 0
    assert json.loads((tmp_path / "d" / "config.json").read_text())["architectures"] == ["Eagle3Speculator"]
    assert main(["export", "--checkpoint", str(run_dir), "--format", "eagle", "--out", str(tmp_path / "e")]) == 1


def test_export_never_deletes_a_folder_that_is_not_an_export(run_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(TrainingError, match="holds other files"):
        export_checkpoint(run_dir, run_dir, fmt="sglang")  # the run itself: refused, nothing removed
    assert (run_dir / "checkpoints").is_dir() and (run_dir / "metrics.jsonl").is_file()
    a_file = tmp_path / "notes.txt"
    a_file.write_text("keep me")
    with pytest.raises(TrainingError, match="is a file"):
        export_checkpoint(run_dir, a_file, fmt="sglang")
    assert a_file.read_text() == "keep me"
    out = export_checkpoint(run_dir, tmp_path / "draft", fmt="sglang")
    assert export_checkpoint(run_dir, out, fmt="speculators") == out  # an earlier export is replaced
    assert not list(tmp_path.glob(".*.tmp-*"))


def variant(run_dir: Path, out: Path, weights: dict | None = None, draft_config: dict | None = None) -> Path:
    """Return a copy of the run's checkpoint at `out` with some weights and draft_config fields replaced."""
    from safetensors.torch import load_file, save_file

    ckpt = next((run_dir / "checkpoints").glob("step-*"))
    out.mkdir(parents=True)
    for f in ckpt.iterdir():
        (out / f.name).write_bytes(f.read_bytes())
    tensors = load_file(str(out / "draft.safetensors"))
    tensors.update(weights or {})
    save_file(tensors, str(out / "draft.safetensors"), metadata={"format": "pt"})
    meta = json.loads((out / "meta.json").read_text())
    meta["draft_config"].update(draft_config or {})
    (out / "meta.json").write_text(json.dumps(meta))
    return out


def checkpoint_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(next((run_dir / "checkpoints").glob("step-*")) / "draft.safetensors"))


def test_a_diverged_checkpoint_is_refused_at_export_and_a_nan_export_at_load(run_dir: Path, tmp_path: Path) -> None:
    from training.errors import ModelMismatchError

    fc = checkpoint_weights(run_dir)["fc.weight"].clone()
    fc[0, 0] = float("nan")
    with pytest.raises(ModelMismatchError, match="NaN or inf in fc.weight.*diverged"):
        export_checkpoint(variant(run_dir, tmp_path / "nan", {"fc.weight": fc}), tmp_path / "out")
    assert not (tmp_path / "out").exists()
    # an export whose weights went NaN afterwards (or another tool's) is refused by load_draft, so by eval
    out = export_checkpoint(run_dir, tmp_path / "good", fmt="sglang")
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(out / "model.safetensors"))
    tensors["lm_head.weight"][1, 1] = float("inf")
    save_file(tensors, str(out / "model.safetensors"))
    with pytest.raises(ModelMismatchError, match="NaN or inf in lm_head.weight"):
        load_draft(out)


@pytest.mark.parametrize(("field", "value"), [("vocab_size", 2_000_000_000), ("hidden_size", -1),
                                              ("intermediate_size", 1e30), ("num_attention_heads", 0)])
def test_an_exports_stated_sizes_are_bounded_before_anything_is_allocated(
    run_dir: Path, tmp_path: Path, field: str, value: float
) -> None:
    """An export's `vocab_size: 2e9` once made eval try to allocate a terabyte (issue 38 item 9)."""
    import json

    from training.errors import ModelMismatchError

    for fmt in ("sglang", "speculators"):
        out = export_checkpoint(run_dir, tmp_path / fmt, fmt=fmt)
        config = json.loads((out / "config.json").read_text())
        where = config.get("transformer_layer_config", config)
        where[field] = value
        if field == "vocab_size":
            config[field] = value
        (out / "config.json").write_text(json.dumps(config))
        with pytest.raises(ModelMismatchError, match=rf"{field}|not a size a draft has|more than any draft"):
            load_draft(out)


def test_a_wrongly_shaped_fc_or_an_out_of_range_d2t_is_refused_at_export(run_dir: Path, tmp_path: Path) -> None:
    from training.errors import ModelMismatchError

    weights = checkpoint_weights(run_dir)
    fc = weights["fc.weight"]
    with pytest.raises(ModelMismatchError, match=r"fc.weight is \[64, 128\], expected \[64, 192\]"):
        export_checkpoint(variant(run_dir, tmp_path / "fc", {"fc.weight": fc[:, :128].clone()}), tmp_path / "a")
    d2t = weights["d2t"].clone()
    d2t[-1] = 10**6
    with pytest.raises(ModelMismatchError, match="outside the target vocabulary"):
        export_checkpoint(variant(run_dir, tmp_path / "d2t", {"d2t": d2t}), tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_export_sweeps_the_temporaries_of_killed_exports_but_not_a_users_folder(run_dir: Path, tmp_path: Path) -> None:
    killed = tmp_path / ".draft.export.tmp-4242"  # a kill between writing and renaming leaves this
    killed.mkdir()
    (killed / "model.safetensors").write_bytes(b"partial")
    users = tmp_path / ".draft.export.tmp-4343"  # same shape of name, but not an export's files: kept
    users.mkdir()
    (users / "notes.txt").write_text("mine")
    other = tmp_path / ".other.export.tmp-4242"  # another output's temporary: not ours to judge
    other.mkdir()
    export_checkpoint(run_dir, tmp_path / "draft", fmt="sglang")
    assert not killed.exists()
    assert (users / "notes.txt").read_text() == "mine" and other.exists()


def test_an_export_killed_while_safetensors_writes_leaves_nothing_the_next_export_keeps(
    run_dir: Path, tmp_path: Path
) -> None:
    """safetensors writes `.tmpXXXXXX` and renames it: a kill mid-write once left a temporary folder that
    no later export removed (issue 38 item 12). Measured: SIGKILL of a 600 MB export leaves
    `.draft.<hex>.tmp/.tmpoZSfdU` (today's name for that folder: `.draft.export.tmp-PID`)."""
    killed = tmp_path / ".draft.export.tmp-4444"
    killed.mkdir()
    (killed / ".tmpoZSfdU").write_bytes(b"part of the weights")
    export_checkpoint(run_dir, tmp_path / "draft", fmt="sglang")
    assert not killed.exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".draft.")) == []


ROOT = Path(__file__).resolve().parents[3]
# An export SIGKILLed right after it renamed the earlier export aside, before the new one went in,
# as on a system without renameat2 (where the kernel can exchange, there is no such moment).
KILL_WHEN_ASIDE = """
import os, signal, sys
import training.io.publish as folder_publish
real = os.rename
def rename(src, dst, *args, **kwargs):
    real(src, dst, *args, **kwargs)
    if ".old.tmp-" in os.path.basename(str(dst)):
        os.kill(os.getpid(), signal.SIGKILL)
os.rename, folder_publish.exchange = rename, lambda a, b: False
from training.export.export import export_checkpoint
export_checkpoint(sys.argv[1], sys.argv[2], fmt=sys.argv[3])
"""


def test_an_export_killed_between_its_two_renames_keeps_the_earlier_export(run_dir: Path, tmp_path: Path) -> None:
    from training.export.export import publisher

    out = export_checkpoint(run_dir, tmp_path / "draft", fmt="sglang")
    before = (out / "config.json").read_text()
    users = tmp_path / ".draft.old.tmp-4545"  # an aside's shape of name, but not an export's files: kept
    users.mkdir()
    (users / "notes.txt").write_text("mine")
    proc = subprocess.run([sys.executable, "-c", KILL_WHEN_ASIDE, str(run_dir), str(out), "speculators"], cwd=ROOT,
                          capture_output=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    assert not out.exists() and len(list(tmp_path.glob(".draft.old.tmp-*"))) == 2  # the earlier export, aside
    assert len(list(tmp_path.glob(".draft.export.tmp-*"))) == 1  # the new export, never renamed in
    publisher(out).remove_stale()  # what the next export does first, under the lock
    assert (out / "config.json").read_text() == before  # the earlier export is back, not deleted
    assert list(tmp_path.glob(".draft.old.tmp-*")) == [users] and not list(tmp_path.glob(".draft.export.tmp-*"))
    assert export_checkpoint(run_dir, out, fmt="speculators") == out  # and the next export replaces it
    assert "Eagle3Speculator" in (out / "config.json").read_text() and (users / "notes.txt").read_text() == "mine"


def test_a_second_export_to_the_same_folder_is_refused_while_one_runs(run_dir: Path, tmp_path: Path) -> None:
    from training.io.outlock import OutputBusyError, OutputLock

    with OutputLock(tmp_path, ".draft.export.lock", "curator export"):  # a live export of tmp_path/draft
        with pytest.raises(OutputBusyError, match="being written by another curator export"):
            export_checkpoint(run_dir, tmp_path / "draft", fmt="sglang")
    assert not (tmp_path / "draft").exists()
    assert export_checkpoint(run_dir, tmp_path / "draft", fmt="sglang").is_dir()  # once it is done


def test_the_export_lock_names_the_output_not_its_parent(run_dir: Path, tmp_path: Path) -> None:
    """The refusal once named tmp_path, the folder the lock sits in (issue 38 item 15)."""
    import re

    from training.io.outlock import OutputBusyError, OutputLock

    with OutputLock(tmp_path, ".draft.export.lock", "curator export"):
        with pytest.raises(OutputBusyError, match=rf"^{re.escape(str(tmp_path / 'draft'))} is being written"):
            export_checkpoint(run_dir, tmp_path / "draft", fmt="sglang")


@pytest.mark.parametrize("fmt", ["sglang", "speculators"])
def test_a_draft_on_four_aux_layers_is_exported_with_its_real_count(run_dir: Path, sharp_target: Path,
                                                                    tmp_path: Path, fmt: str) -> None:
    import shutil

    # four of the tiny target's layers include its last output (id 4): a target class whose SGLang
    # model loop captures it (Gemma-3), so that SGLang can be told to
    target = tmp_path / "target"
    shutil.copytree(sharp_target, target)
    tcfg = json.loads((target / "config.json").read_text())
    tcfg["architectures"] = ["Gemma3ForCausalLM"]
    (target / "config.json").write_text(json.dumps(tcfg))
    ckpt = variant(run_dir, tmp_path / "four", {"fc.weight": torch.randn(64, 4 * 64) * 0.02},
                   {"aux_layer_ids": [1, 2, 3, 4], "num_aux_layers": 4})
    meta = json.loads((ckpt / "meta.json").read_text())
    meta["target_config"]["architectures"], meta["target_dir"] = ["Gemma3ForCausalLM"], str(target)
    (ckpt / "meta.json").write_text(json.dumps(meta))
    out = export_checkpoint(ckpt, tmp_path / fmt, fmt=fmt)
    cfg = json.loads((out / "config.json").read_text())
    # both engines' EAGLE-3 drafts size fc from num_aux_hidden_states first (vLLM: from the
    # transformer_layer_config of the speculators layout), else from eagle_config's ids, else 3
    layer = cfg if fmt == "sglang" else cfg["transformer_layer_config"]
    assert layer["num_aux_hidden_states"] == 4 and shapes(out)["fc.weight"] == (64, 256)
    assert cfg["curator"]["aux_layer_inputs"] == [1, 2, 3, 4]
    if fmt == "sglang":
        assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2, 3]  # Gemma-3 adds one
    loaded = load_draft(out, target_dir=target)
    assert loaded.config.num_aux_layers == 4 and loaded.config.aux_layer_ids == [1, 2, 3, 4]


def test_an_sglang_export_for_a_target_class_sglang_does_not_know_is_refused(run_dir: Path, tmp_path: Path) -> None:
    from training.errors import ModelMismatchError

    ckpt = variant(run_dir, tmp_path / "arch")
    meta = json.loads((ckpt / "meta.json").read_text())
    meta["target_config"]["architectures"] = ["BrandNewForCausalLM"]
    (ckpt / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ModelMismatchError, match="not in SGLang 0.5.23's model registry"):
        export_checkpoint(ckpt, tmp_path / "sg", fmt="sglang")
    assert export_checkpoint(ckpt, tmp_path / "spec", fmt="speculators").is_dir()  # vLLM reads ids as inputs


@pytest.mark.parametrize("fmt", ["sglang", "speculators"])
def test_an_export_on_a_full_disk_says_so_and_leaves_nothing(run_dir: Path, tmp_path: Path, fmt: str) -> None:
    # issue 38 item 11: it said "unexpected SafetensorError ... No space left on device ... please report it"
    from tests.reliability.test_reliability_diskfull import _assert_disk_full, _small_disk_works, on_small_disk

    if not _small_disk_works():
        pytest.skip("needs unshare -rm and tmpfs mounts")
    disk = tmp_path / "disk"
    rc, err, left = on_small_disk("64k", disk, sys.executable, "-m", "curator", "export", "--checkpoint", str(run_dir),
                                  "--format", fmt, "--out", str(disk / "draft"))
    _assert_disk_full(rc, err, disk / "draft")
    assert "unexpected" not in err and ".tmp" not in left and "draft" not in left.replace(str(disk), "")


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o002, 0o664)])
def test_the_exported_weights_get_the_same_mode_as_the_config(run_dir: Path, tmp_path: Path, mask: int, mode: int) -> None:
    # safetensors writes through a 0600 temp file: a serving engine running as another user could not read the weights
    before = os.umask(mask)
    try:
        out = export_checkpoint(run_dir, tmp_path / "served", fmt="sglang")
    finally:
        os.umask(before)
    modes = {name: (out / name).stat().st_mode & 0o777 for name in ("config.json", "model.safetensors")}
    assert modes == {"config.json": mode, "model.safetensors": mode}


@pytest.mark.parametrize("fmt", ["sglang", "speculators"])
def test_a_checkpoint_whose_config_the_shared_check_refuses_is_never_exported(run_dir: Path, tmp_path: Path, fmt: str) -> None:
    """An export is held to the check load_draft and the doctor share (issue 49 item 7): an rms_norm_eps of
    NaN would export a draft that proposes nothing, which eval then refuses."""
    from training.errors import ModelMismatchError

    with pytest.raises(ModelMismatchError, match="rms_norm_eps=nan"):
        export_checkpoint(variant(run_dir, tmp_path / "eps", draft_config={"rms_norm_eps": float("nan")}),
                          tmp_path / "out", fmt=fmt)
    assert not (tmp_path / "out").exists()
