"""The rules planner: scouting without a model, with a score anyone can check by hand.

Per brief: run its seed queries, inspect the top hits, score each dataset on six visible
parts, record the best through the same toolbox the model agents use (so the catalog's audit
trail is the same), then finish. It is the fallback for machines without model access and the
baseline the model agents must beat.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from curator.hub import DatasetDetails
from curator.scout.briefs import Brief
from curator.scout.tools import AgentToolbox

# Licenses that allow training and redistribution of derived data without asking anyone.
PERMISSIVE = {"apache-2.0", "mit", "cc-by-4.0", "cc-by-3.0", "cc0-1.0", "odc-by", "bsd-2-clause", "bsd-3-clause", "cc-by-sa-4.0", "cc-by-sa-3.0", "pddl"}
CHAT_TASKS = ("text-generation", "question-answering", "conversational", "text2text-generation")
PROMPT_COLUMNS = ("messages", "conversations", "conversation", "trajectory", "chat", "instruction", "prompt", "query", "input", "problem_statement", "question")
STOPWORDS = {"data", "dataset", "datasets", "model", "models", "such", "with", "that", "this", "from", "for", "the", "and", "large", "like"}

# The weights of the score's parts; they sum to 1.0 so a score is directly a relevance.
W_KEYWORDS, W_GOAL, W_PROMPTS, W_TASKS, W_DOWNLOADS, W_LICENSE, W_SIZE = 0.30, 0.10, 0.15, 0.05, 0.10, 0.15, 0.15


@dataclass
class Score:
    """A dataset's rules score and the parts it is made of, for the rationale."""

    total: float
    parts: list[tuple[str, float, str]]  # (name, points, why)

    def explain(self) -> str:
        """Return 'score 0.62 = keywords 0.20 (agent, tool) + ...' for the catalog's rationale."""
        shown = " + ".join(f"{name} {points:.2f}" + (f" ({why})" if why else "") for name, points, why in self.parts)
        return f"rules score {self.total:.2f} = {shown}"


def _words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9][a-z0-9+#.]*", text.lower()) if len(w) >= 3 and w not in STOPWORDS}


def _searchable(details: DatasetDetails) -> str:
    return " ".join([details.id, " ".join(details.tags), details.card_text[:5000], " ".join(details.features)]).lower()


def _license_share(license: str | None) -> float:
    lic = (license or "").lower()
    if not lic:
        return 1 / 3  # unstated: a person must check, but it may well be fine
    if "nc" in lic.split("-") or "research" in lic or "noncommercial" in lic:
        return 0.0
    if lic in PERMISSIVE:
        return 1.0
    return 0.5  # "other" or a custom license: readable terms, unknown fit


def score_dataset(details: DatasetDetails, brief: Brief, goal: str) -> Score:
    """Return the transparent rules score of one inspected dataset for one brief and goal."""
    text = _searchable(details)
    parts: list[tuple[str, float, str]] = []

    hits = [k for k in brief.keywords if k.lower() in text]
    # three keyword hits earn the full share: more would only reward long cards
    parts.append(("keywords", W_KEYWORDS * min(len(hits) / 3.0, 1.0), ", ".join(hits[:5])))

    goal_words = _words(goal)
    goal_hits = sorted(w for w in goal_words if w in text)
    parts.append(("goal", W_GOAL * (min(len(goal_hits) / 2.0, 1.0) if goal_words else 0.0), ", ".join(goal_hits[:4])))

    columns = [c for c in details.features if c.lower() in PROMPT_COLUMNS]
    parts.append(("prompt columns", W_PROMPTS if columns else 0.0, ", ".join(columns[:3]) or ("no schema" if not details.features else "none")))

    tasks = [t for t in details.task_categories if t in CHAT_TASKS]
    parts.append(("task tags", W_TASKS if tasks else 0.0, ", ".join(tasks[:2])))

    downloads = details.downloads or 0
    dl = min(math.log10(downloads) / 6.0, 1.0) if downloads > 1 else 0.0  # 1M downloads = full share
    parts.append(("downloads", W_DOWNLOADS * dl, f"{downloads:,}" if details.downloads is not None else "unknown"))

    license_points = W_LICENSE * _license_share(details.license)
    if details.gated:
        license_points = max(license_points - W_LICENSE / 3.0, 0.0)  # someone must accept terms first
    why = (details.license or "unstated") + (f", gated {details.gated}" if details.gated else "")
    parts.append(("license", license_points, why))

    rows = details.max_rows()
    if rows is None:
        size_points, size_why = W_SIZE / 4.0, "rows unknown"
    else:
        # 100K rows or more earn the full share; a few hundred rows almost nothing
        size_points = W_SIZE * min(max(math.log10(max(rows, 1)) - 2.0, 0.0) / 3.0, 1.0)
        size_why = f"{rows:,} rows" if details.num_rows is not None else f"up to {rows:,} rows"
    parts.append(("size", size_points, size_why))

    total = round(min(max(sum(p for _, p, _ in parts), 0.0), 1.0), 4)
    return Score(total, [(n, round(p, 4), w) for n, p, w in parts])


def suggested_samples(details: DatasetDetails, brief: Brief, target_samples: int, share: float) -> int:
    """Return a sample count: this dataset's share of the brief's quota, within the dataset's rows."""
    want = max(int(round(brief.weight * target_samples * share)), 100)
    rows = details.max_rows()
    return max(min(want, rows), 1) if rows else want


async def run_rules_agent(
    brief: Brief,
    toolbox: AgentToolbox,
    goal: str,
    *,
    hits_per_query: int = 5,
    max_inspect: int = 8,
    max_candidates: int = 4,
    min_score: float = 0.35,
    target_samples: int = 100_000,
) -> str:
    """Scout one brief by rules through `toolbox` (searches, inspections, records, finish); return the summary."""
    turn = 0
    found: list[str] = []
    for query in brief.seed_queries:
        turn += 1
        result = await toolbox.call("search_datasets", {"query": query, "limit": hits_per_query}, turn)
        hits = [] if result.is_error else (result.data or [])
        for hit in hits:
            if hit.id not in found:
                found.append(hit.id)
    scored: list[tuple[Score, DatasetDetails]] = []
    for dataset_id in found[:max_inspect]:
        turn += 1
        result = await toolbox.call("inspect_dataset", {"dataset_id": dataset_id}, turn)
        if not result.is_error and isinstance(result.data, DatasetDetails):
            scored.append((score_dataset(result.data, brief, goal), result.data))
    scored.sort(key=lambda s: (-s[0].total, s[1].id))
    chosen = [(score, details) for score, details in scored if score.total >= min_score][:max_candidates]
    weight_sum = sum(score.total for score, _ in chosen) or 1.0
    recorded = []
    for score, details in chosen:
        turn += 1
        args = {
            "dataset_id": details.id,
            "category": brief.category,
            "relevance": score.total,
            "rationale": f"{brief.title}: {score.explain()}",
            "suggested_samples": suggested_samples(details, brief, target_samples, score.total / weight_sum),
        }
        result = await toolbox.call("record_candidate", args, turn)
        if not result.is_error:
            recorded.append(f"{details.id} ({score.total:.2f})")
    below = len(scored) - len(chosen)
    summary = (
        f"rules planner for {brief.id}: {len(brief.seed_queries)} searches, {len(found)} distinct hits, "
        f"{len(scored)} inspected; recorded {len(recorded)}: {', '.join(recorded) or 'none'}; "
        f"{below} below the bar (score < {min_score}) or beyond the top {max_candidates}"
    )
    await toolbox.call("finish", {"summary": summary}, turn + 1)
    return summary
