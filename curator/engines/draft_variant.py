"""Whether each engine that reads an export builds the EAGLE-3.1 norms the draft was trained with.

An engine that builds a draft without a norm it was trained with (or with one it was not) serves it
silently wrong, as SGLang's EAGLE-for-EAGLE3 flag did: nothing fails, acceptance drops. What the draft
was trained with is the toolkit's record (`curator.variant`), else what the layout's own format says,
widened by the norm weights the file holds; what each engine builds comes from the layout
(training/eagle3/layouts/, read from the engines' code: docs/eagle3-variants.md).
"""

from __future__ import annotations

from curator.engines.draft import DraftLayout
from curator.engines.launch import Check
from training.eagle3.layouts.base import VARIANT_KEYS, variant_text, variant_weights


def check_variant(layout: DraftLayout) -> list[Check]:
    """Return one check per engine of the layout: its norms against the trained ones, and the norm weights."""
    lay = layout.layout
    if lay is None:
        return []
    shapes = {lay.internal_name(k): v for k, v in layout.shapes.items()}  # legacy names as the engines rename them
    trained = lay.trained_variant(layout.config)
    # a norm's weights in the file say it was trained, whatever the config says
    trained["norm_before_fc"] = trained["norm_before_fc"] or "input_norm.weight" in shapes
    trained["fc_norm"] = trained["fc_norm"] or any(k.startswith("fc_norm.") for k in shapes)
    if trained["norm_before_fc"] and trained["fc_norm"]:
        return [Check("norms", "error", "the draft has both norm_before_fc (input_norm) and fc_norm: speculators "
                                        "refuses the pair and the engines would apply both; re-export the checkpoint")]
    n_aux = lay.fc_aux_count(layout.config)
    missing = [k for k in variant_weights(trained, n_aux) if k not in shapes]
    if missing:
        return [Check("norms", "error", f"the config turns on {variant_text(trained)} but the file lacks "
                                        f"{', '.join(missing)}: the engines would serve the norm untrained (weight 1)")]
    checks = []
    for engine, served in lay.served_variants(layout.config).items():
        wrong = [k for k in VARIANT_KEYS if served[k] != trained[k]]
        if not wrong:
            checks.append(Check(f"norms ({engine.split()[0]})", "ok", f"{engine} builds {variant_text(trained)}, as trained"))
            continue
        said = "; ".join(f"{k}: builds {str(served[k]).lower()}, trained {str(trained[k]).lower()}" for k in wrong)
        dropped = [k for k in variant_weights(trained, n_aux) if k in shapes
                   and not variant_weights(served, n_aux).count(k)]
        checks.append(Check(f"norms ({engine.split()[0]})", "error",
                            f"{engine} would serve this draft with other norms than it was trained with ({said})"
                            + (f", skipping {', '.join(dropped[:3])}" if dropped else "")
                            + f": acceptance drops silently; {_remedy(lay.name, wrong)}"))
    return checks


def _remedy(layout: str, wrong: list[str]) -> str:
    """Return what to do about an engine that misreads the norms."""
    if layout == "sglang" and "norm_before_residual" in wrong:
        return ("SGLang has no norm_before_residual: serve it with vLLM from a speculators export "
                "(curator export --format speculators)")
    return "re-export it with curator export (which writes every norm key explicitly)"
