"""An exported draft read back, in any layout: its config.json, and the draft it holds (float32, eval
mode). What `curator eval`, the doctor's checks of values and `init_from` all load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from training.eagle3.layouts import Layout, layout_of
from training.eagle3.model import Eagle3Draft
from training.eagle3.weights import check_servable, header_dtype
from training.errors import ModelMismatchError, TrainingError
from training.io.export_folder import WEIGHTS_FILE, provenance, read_export_config
from training.io.weights import read_weights
from training.target.config import read_target_config
from training.target.head import load_embeddings


def load_draft(export_dir: str | Path, target_dir: str | Path | None = None) -> Eagle3Draft:
    """Return the draft in an export directory (any layout), float32, in eval mode.

    Embeddings come from the export when it has them, else from `target_dir` (or the target
    recorded at export time when that directory still exists). Non-finite or mis-shaped weights are
    refused (ModelMismatchError).
    """
    root = Path(export_dir)
    return load_exported(root, read_export_config(root), target_dir)


def load_exported(root: Path, config: dict[str, Any], target_dir: str | Path | None = None) -> Eagle3Draft:
    """Return the draft of the export in `root` whose config.json is `config` (load_draft, the config read)."""
    target = target_dir or provenance(config).get("target_dir")
    target_config = read_target_config(target) if target and Path(target).exists() else None
    layout: Layout = layout_of(config)
    # what the engines refuse or misserve (a layer count of 1000000) is refused here too: eval would
    # otherwise measure a draft the toolkit builds its own way, which no engine serves
    problems = layout.config_problems(config)
    if problems:
        raise ModelMismatchError(f"{root}/config.json: {'; '.join(problems)}")
    try:
        cfg = layout.draft_config(config, target_config)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ModelMismatchError(f"{root}/config.json lacks or garbles a field the draft needs ({exc!r}); "
                                 "re-export the draft with curator export") from exc
    file_weights = read_weights(root / WEIGHTS_FILE)
    # the check the doctor makes of the same file: names, dtypes (int8 weights ran at acceptance 1.0), shapes
    problems = layout.tensor_problems(config, {k: (tuple(v.shape), header_dtype(v)) for k, v in file_weights.items()})
    if problems:
        raise ModelMismatchError(f"{root / WEIGHTS_FILE}: {'; '.join(problems)}; re-export the draft with curator export")
    weights = layout.internal_weights(file_weights)
    weights = {k: (v.float() if v.is_floating_point() else v) for k, v in weights.items()}
    check_servable(weights, cfg, f"export {root}")
    draft = Eagle3Draft(cfg)
    missing, unexpected = draft.load_state_dict(weights, strict=False)
    # d2t/t2d are left out of an export whose draft vocabulary is the target's (identity maps)
    optional = {"embed_tokens.weight"} | ({"d2t", "t2d"} if cfg.draft_vocab_size == cfg.vocab_size else set())
    if unexpected or set(missing) - optional:
        raise ModelMismatchError(f"{root} weights do not fit its config (missing {missing}, unexpected {unexpected})")
    if "embed_tokens.weight" in missing:
        if not target or not Path(target).exists():
            raise TrainingError(f"{root} has no embeddings; pass the target's model directory to load them from")
        draft.load_embeddings(load_embeddings(target))
    return draft.eval()
