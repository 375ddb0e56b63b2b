"""The draft-kind registry: EAGLE-3 built in, checkpoints from before kinds were recorded still EAGLE-3's,
and asking it costs no torch import."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from tests.training.train.test_trainer import one_thread, sharp_target, store_dir, tiny_config  # noqa: F401  (fixtures)
from training.drafts.registry import formats, kind_named
from training.export.export import export_checkpoint
from training.train.checkpoint import read_meta
from training.train.trainer import train


def test_eagle3_is_the_built_in_kind_and_owns_both_layouts() -> None:
    assert kind_named("eagle3").name == "eagle3" and formats() == ("sglang", "speculators")


def test_a_checkpoint_from_before_kinds_were_recorded_exports_as_eagle3(store_dir: Path, sharp_target: Path,
                                                                        tmp_path: Path) -> None:
    result = train(tiny_config(store_dir, sharp_target, tmp_path / "run", max_steps=2, draft_vocab_size=64,
                               eval_fraction=0.0))
    assert read_meta(result.checkpoint)["draft_kind"] == "eagle3"
    old = tmp_path / "old" / result.checkpoint.name
    shutil.copytree(result.checkpoint, old)
    meta = json.loads((old / "meta.json").read_text())
    del meta["draft_kind"]
    (old / "meta.json").write_text(json.dumps(meta))

    new_export = export_checkpoint(result.checkpoint, tmp_path / "new", fmt="sglang")
    old_export = export_checkpoint(old, tmp_path / "old-export", fmt="sglang")
    new_cfg, old_cfg = (json.loads((p / "config.json").read_text()) for p in (new_export, old_export))
    new_cfg["curator"].pop("checkpoint"), old_cfg["curator"].pop("checkpoint")  # the folders differ, nothing else
    assert old_cfg == new_cfg
    assert (old_export / "model.safetensors").read_bytes() == (new_export / "model.safetensors").read_bytes()


def test_asking_the_registry_loads_no_torch() -> None:
    # curator doctor and the engines' launch checks ask it for layouts; their usage errors must stay fast
    code = ("import sys; import curator.doctor, curator.engines.draft, training.drafts.registry as r; "
            "r.formats(); r.layouts(); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
