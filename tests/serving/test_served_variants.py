"""EAGLE-3.1 drafts served by a real vLLM (CPU build): trained with the norms, exported, and served with
the acceptance `curator eval` measures on the same prompts (greedy, same draft length and budget).

A draft served without a norm it was trained with would propose other tokens: its acceptance would
fall below what the toolkit measures on its own copy of the draft (the test would fail).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from serving_fixtures import STEPS, engine_acceptance, heldout_prompt_ids, spec_args, toolkit_acceptance
from vllm_process import VllmServer, start_or_fail

# (layout, norms): speculators' EAGLE-3.1 defaults go out in the speculators layout (SGLang has no
# norm_before_residual); the per-state norms and the fed-back normed state in the SGLang layout
CASES = [("speculators", {"norm_before_fc": True, "norm_output": True, "norm_before_residual": True}),
         ("sglang", {"fc_norm": True, "norm_output": True})]


def variant_export(demo: Path, layout: str, norms: dict[str, bool]) -> Path:
    """The demo's draft trained again with `norms` (the demo's own train config otherwise), exported in `layout`."""
    import yaml

    from training.export.export import export_checkpoint
    from training.train.checkpoint import latest_checkpoint
    from training.train.config import TrainConfig
    from training.train.trainer import train

    tag = "-".join(sorted(norms))
    run, out = demo / f"run-{tag}", demo / f"export-{tag}-{layout}"
    if not (run.exists() and latest_checkpoint(run)):
        base = yaml.safe_load((demo / "train.yaml").read_text())
        train(TrainConfig.from_dict({**base, **norms, "out": str(run)}))
    if not (out / "config.json").is_file():
        export_checkpoint(run, out, fmt=layout)
    return out


@pytest.mark.parametrize(("layout", "norms"), CASES, ids=[c[0] for c in CASES])
def test_vllm_serves_an_eagle31_draft_with_the_acceptance_curator_eval_measures(
        layout: str, norms: dict[str, bool], demo: Path, logs: Path) -> None:
    draft = variant_export(demo, layout, norms)
    prompts = heldout_prompt_ids(demo)
    ours = toolkit_acceptance(demo, draft)
    with start_or_fail(VllmServer(demo / "target", logs, spec_args(draft), max_num_seqs=2)) as server:
        engine = engine_acceptance(server, prompts)
    print(f"{layout} {norms}: engine {engine}, curator eval {ours}")
    assert engine["tokens"] == ours["tokens"]
    assert engine["acceptance_length"] == pytest.approx(ours["acceptance_length"], rel=0.02)
    assert len(engine["per_position"]) == STEPS
    for got, want in zip(engine["per_position"], ours["per_position"]):
        assert got == pytest.approx(want, abs=0.02)
