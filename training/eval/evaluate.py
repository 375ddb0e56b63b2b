"""`curator eval`'s run: the target loaded, every prompt decoded speculatively and greedily, the report
(per category and traffic-weighted) beside the offline estimate from stored states (the draft kind's:
EAGLE-3's is training/eagle3/offline.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from training.errors import TrainingError
from training.eval.decode import GreedyMismatchError, GreedyResult, greedy_decode, speculative_decode
from training.eval.prompts import EvalPrompt, render_prompt
from training.eval.proposers import Proposer
from training.eval.sampling import Sampling
from training.eval.simulate import AcceptanceStats


@dataclass
class PromptRecord:
    """Per-prompt outcome, for the JSON report."""

    id: str
    category: str
    prompt_tokens: int
    new_tokens: int
    forwards: int
    acceptance_length: float
    greedy_match: str  # "exact" | "tie@i" (diverged at a near-tie of the target's logits) | "sampled"


@dataclass
class EvalReport:
    """The outcome of an evaluation run."""

    steps: int
    topk: int
    max_new_tokens: int
    overall: AcceptanceStats
    categories: dict[str, AcceptanceStats]
    prompts: list[PromptRecord]
    skipped: dict[str, int]  # reason -> count
    new_tokens: int = 0
    spec_s: float = 0.0
    draft_s: float = 0.0
    greedy_s: float = 0.0
    ties: int = 0
    offline: dict[str, Any] | None = None
    sampling: Sampling | None = None  # None: greedy verification, every output checked against greedy
    traffic: dict[str, Any] | None = None  # acceptance weighted by a traffic profile's shares (traffic_weighted)

    def skip(self, reason: str) -> None:
        """Count a prompt left out, by reason."""
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def to_json(self) -> dict[str, Any]:
        """Return the report as JSON-ready data (NaN, which JSON lacks, as null)."""
        return finite({
            "steps": self.steps, "topk": self.topk, "max_new_tokens": self.max_new_tokens,
            "prompts_decoded": len(self.prompts), "skipped": self.skipped, "new_tokens": self.new_tokens,
            "acceptance_length": self.overall.acceptance_length, "overall": self.overall.to_json(),
            "categories": {c: s.to_json() for c, s in sorted(self.categories.items())},
            "greedy_ties": self.ties,
            "sampling": asdict(self.sampling) if self.sampling is not None else None,
            "timing_s": {"speculative": self.spec_s, "draft": self.draft_s, "greedy": self.greedy_s},
            "offline_estimate": self.offline,
            "traffic_weighted": self.traffic,
            "per_prompt": [asdict(p) for p in self.prompts],
        })


def finite(value: Any) -> Any:
    """Return `value` with every non-finite float (NaN: nothing to measure) replaced by None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


def load_target(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> tuple[Any, Any]:
    """Return (model, tokenizer) of a local target, in eval mode on `device`."""
    if not (Path(path) / "config.json").is_file():
        # never fall through to a Hub download: eval measures the model on this disk
        raise TrainingError(f"{path} is not a local model directory (no config.json)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    except OSError as exc:
        raise TrainingError(f"cannot load the target from {path}: {exc}") from None
    model = model.to(device)  # type: ignore[arg-type]  # transformers' stub types .to() as a PreTrainedModel's
    return model.eval(), tokenizer


def eos_token_ids(target: Any, tokenizer: Any) -> set[int]:
    """Return every token id that ends a generation (config, generation config, tokenizer)."""
    ids: set[int] = set()
    for source in (getattr(target, "generation_config", None), target.config, tokenizer):
        value = getattr(source, "eos_token_id", None)
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return ids


def evaluate(
    target: Any,
    tokenizer: Any,
    proposer: Proposer,
    prompts: Iterable[EvalPrompt],
    *,
    steps: int = 3,
    topk: int = 1,
    max_new_tokens: int = 128,
    tie_margin: float = 1e-4,
    on_prompt: Callable[[PromptRecord], None] | None = None,
    sampling: Sampling | None = None,
    greedy: Mapping[str, GreedyResult] | None = None,
) -> EvalReport:
    """Return acceptance statistics of speculative decoding over `prompts`, each checked against greedy.

    A prompt whose speculative output differs from greedy decoding fails the run, unless the
    greedy reference chose that token by a logit margin under `tie_margin` (numerically a tie,
    which batched and one-token forwards may break differently); such prompts are counted as
    ties and compared up to the divergence. With `sampling` the target samples (each prompt from
    its own seeded generator) and there is no greedy reference to compare with.

    `greedy`: the target's greedy decodes by prompt id, made once (greedy_decode, the same
    `max_new_tokens`) for several drafts measured on the same prompts; a prompt missing from it is
    decoded here. A decode that fits another token budget is refused (TrainingError).
    """
    eos = eos_token_ids(target, tokenizer)
    max_pos = int(getattr(target.config, "max_position_embeddings", 0) or 0)
    report = EvalReport(steps=steps, topk=topk, max_new_tokens=max_new_tokens,
                        overall=AcceptanceStats(steps), categories={}, prompts=[], skipped={}, sampling=sampling)
    for prompt in prompts:
        try:
            ids = render_prompt(tokenizer, prompt.messages)
        except Exception as exc:  # jinja and tokenizer errors alike mean: this prompt cannot be rendered
            report.skip(f"unrenderable ({type(exc).__name__})")
            continue
        if not ids:
            report.skip("empty after rendering")
            continue
        if max_pos and len(ids) + max_new_tokens + steps + 1 > max_pos:
            report.skip("too long for the target's context")
            continue
        reference = None
        if sampling is None:
            reference = _cached_greedy(greedy, prompt.id, max_new_tokens, eos) or greedy_decode(
                target, ids, max_new_tokens, eos)
        t0 = time.perf_counter()
        spec = speculative_decode(target, proposer, ids, steps=steps, topk=topk, max_new_tokens=max_new_tokens,
                                  eos_ids=eos, sampling=sampling,
                                  generator=sampling.generator(target.device, prompt.id) if sampling else None)
        report.spec_s += time.perf_counter() - t0
        report.draft_s += spec.draft_s
        if reference is not None:
            report.greedy_s += reference.seconds
            match = _compare(prompt.id, spec.tokens, reference, tie_margin)
            report.ties += match != "exact"
        else:
            match = "sampled"
        report.new_tokens += len(spec.tokens)
        report.overall.add(spec.accepted)
        report.categories.setdefault(prompt.category or "all", AcceptanceStats(steps)).add(spec.accepted)
        record = PromptRecord(id=prompt.id, category=prompt.category, prompt_tokens=len(ids),
                              new_tokens=len(spec.tokens), forwards=len(spec.accepted),
                              acceptance_length=1.0 + sum(spec.accepted) / len(spec.accepted) if spec.accepted else math.nan,
                              greedy_match=match)
        report.prompts.append(record)
        if on_prompt is not None:
            on_prompt(record)
    return report


def _cached_greedy(cache: Mapping[str, GreedyResult] | None, prompt_id: str, max_new_tokens: int,
                   eos: set[int]) -> GreedyResult | None:
    """Return the cached greedy decode of a prompt (None: not cached), refusing one made for
    another token budget: it must stop at the budget or at an end-of-sequence token before it."""
    found = (cache or {}).get(prompt_id)
    if found is None:
        return None
    n = len(found.tokens)
    if n > max_new_tokens or (n < max_new_tokens and not (found.tokens and found.tokens[-1] in eos)):
        raise TrainingError(f"the cached greedy decode of prompt {prompt_id!r} has {n} tokens: it was not made "
                            f"with max_new_tokens={max_new_tokens}")
    return found


def _compare(prompt_id: str, spec: list[int], greedy: GreedyResult, tie_margin: float) -> str:
    """Return "exact" or "tie@i"; raise GreedyMismatchError on a real divergence."""
    ref = greedy.tokens
    for i, (s, g) in enumerate(zip(spec, ref)):
        if s != g:
            if greedy.margins[i] <= tie_margin:
                return f"tie@{i}"
            raise GreedyMismatchError(
                f"prompt {prompt_id!r}: speculative decoding gave token {s} at new position {i} where greedy "
                f"decoding of the target gives {g} (logit margin {greedy.margins[i]:.4g}); the verification "
                f"or cache handling is wrong, and measured acceptance would be meaningless"
            )
    if len(spec) != len(ref):
        raise GreedyMismatchError(
            f"prompt {prompt_id!r}: speculative decoding produced {len(spec)} tokens, greedy {len(ref)}"
        )
    return "exact"
