"""Acceptance measured: speculative decoding of eval prompts with a progress bar, weighted by the
traffic and beside the offline estimate when asked; `curator eval` and the demo's eval stage both
measure here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from curator.ui import console, progress


def measure(target: Any, tokenizer: Any, drafter: Any, prompts: list[Any], *, steps: int, max_new_tokens: int,
            tie_margin: float, topk: int = 1, num_draft_tokens: int | None = None, sampling: Any = None,
            weights: Any = None, offline: tuple[Path, Path, Any] | None = None) -> Any:
    """Return the EvalReport of speculative decoding of `prompts` (a progress bar while it runs); with
    `weights` (curator.evaluation.weighting.eval_weights) its traffic-weighted figures; with `offline`
    (store, target directory, held-out split) the offline estimate on the held-out hidden states, at
    the traffic's shares when weighted. `curator eval` and the demo's eval stage both measure here."""
    from training.drafts.registry import kind_of_model
    from training.eval.evaluate import evaluate
    from training.eval.simulate import traffic_weighted

    kind = kind_of_model(drafter)  # its proposer and its offline estimate are its kind's
    with progress() as bar:
        task = bar.add_task("speculative decoding", total=len(prompts))
        report = evaluate(target, tokenizer, kind.proposer(drafter, num_draft_tokens), prompts, steps=steps, topk=topk,
                          max_new_tokens=max_new_tokens, tie_margin=tie_margin, sampling=sampling,
                          on_prompt=lambda _: bar.advance(task))
    if weights is not None:
        if weights.recorded is None:  # once per eval: the simulated figure below uses the same map
            console.print("[yellow]the prompts record no category map (a mix built before build-mix recorded "
                          "`serves`, or not a mix): each category counts for the traffic category of its name only[/]")
        report.traffic = traffic_weighted(report.categories, weights.shares, weights.groups)
    if offline is not None:
        data, model, split = offline
        with console.status("offline estimates on held-out hidden states"):
            report.offline = kind.offline_estimate(drafter.float(), data, model, split, steps=steps, topk=topk,
                                                   num_draft_tokens=num_draft_tokens, max_new_tokens=max_new_tokens,
                                                   traffic_shares=weights.shares if weights else None,
                                                   traffic_groups=weights.groups if weights else None)
    return report
