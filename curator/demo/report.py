"""The demo's final report: a terminal table and `report.html` with plots a browser shows.

Plots are matplotlib PNGs embedded as data URIs, so the page is one file that can be mailed
or opened from a remote machine's workdir without a server.
"""

from __future__ import annotations

import base64
import html
import io
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from curator.loss_report import LOSS_NOTE
from curator.ui import format_value, human_bytes
from training.io.atomic import write_text


@dataclass
class StageResult:
    """What one stage did: its name, wall time, key figures and the command that reproduces it."""

    name: str
    seconds: float
    figures: dict[str, Any]
    command: str


@dataclass
class DemoReport:
    """Everything the demo's report shows."""

    workdir: Path
    stages: list[StageResult] = field(default_factory=list)
    mix_counts: dict[str, int] = field(default_factory=dict)  # category -> prompts
    train_log: list[dict[str, Any]] = field(default_factory=list)  # metrics.jsonl rows
    acceptance_measured: list[float] = field(default_factory=list)  # per draft position
    acceptance_estimated: list[float] = field(default_factory=list)  # per TTT step (offline)
    acceptance_length: float | None = None
    acceptance_length_estimated: float | None = None
    acceptance_agentic: float | None = None  # measured on the held-out tool-calling prompts
    acceptance_traffic: float | None = None  # measured, weighted by the traffic profile's category shares
    eval_steps: int | None = None  # K of the acceptance figures: drafted tokens per round (at most K + 1)
    traffic_shares: dict[str, float] = field(default_factory=dict)  # the profile's categories
    warnings: list[str] = field(default_factory=list)  # signs that a stage learned nothing

    def figure(self, stage: str, key: str) -> Any:
        """Return one figure of a stage, or None."""
        for result in self.stages:
            if result.name == stage:
                return result.figures.get(key)
        return None


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def plots(report: DemoReport) -> dict[str, str]:
    """Return {title: PNG data URI} for the mix, the training curve and acceptance per position."""
    import matplotlib.pyplot as plt

    out: dict[str, str] = {}
    for title, fig in figures(report).items():
        out[title] = _png(fig)
        plt.close(fig)
    return out


def figures(report: DemoReport) -> dict[str, Any]:
    """Return {title: matplotlib figure} for the mix, the training curve and acceptance per position
    (the caller closes them)."""
    os.environ.setdefault("MPLBACKEND", "Agg")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out: dict[str, Any] = {}
    if report.mix_counts:
        # shares, the traffic's target beside what the mix achieved: --match aims at the first, and
        # counts alone do not say whether it got there
        fig, ax = plt.subplots(figsize=(5, 3))
        cats = sorted(set(report.mix_counts) | set(report.traffic_shares))
        total = sum(report.mix_counts.values()) or 1
        achieved = [report.mix_counts.get(c, 0) / total for c in cats]
        slots = list(range(len(cats)))
        width = 0.4 if report.traffic_shares else 0.6
        if report.traffic_shares:
            target = [report.traffic_shares.get(c, 0.0) for c in cats]
            bars = ax.bar([x - width / 2 for x in slots], target, width, color="#dd8452", label="target (traffic profile)")
            ax.bar_label(bars, labels=[f"{v:.0%}" for v in target], padding=2, fontsize=7)
        bars = ax.bar([x + (width / 2 if report.traffic_shares else 0) for x in slots], achieved, width, color="#4c72b0",
                      label="achieved (mix)")
        # the share and the count on each bar (a category with none reads 0%, not a gap)
        ax.bar_label(bars, labels=[f"{v:.0%} ({report.mix_counts.get(c, 0)})" for c, v in zip(cats, achieved)],
                     padding=2, fontsize=7)
        ax.set_xticks(slots, cats)
        ax.set_ylim(0, min(1.0, max([*achieved, *report.traffic_shares.values(), 0.1]) * 1.3))
        ax.yaxis.set_major_formatter(lambda v, _: f"{v:.0%}")
        ax.set_ylabel("share of prompts")
        ax.set_title("Mix: target vs achieved shares" if report.traffic_shares else "Mix composition (shares)")
        ax.legend(fontsize=7)
        out["Mix composition"] = fig

    train_rows = [r for r in report.train_log if "loss" in r and r.get("split", "train") == "train"]
    if train_rows:
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.2))
        if all(r.get("kl") is not None for r in train_rows):
            ax1.plot([r["step"] for r in train_rows], [r["kl"] for r in train_rows], color="#c44e52")
            ax1.set_ylabel("KL to the target (nats)")
            # a title as wide as its axes: what KL means is in the y label and the report's table
            ax1.set_title("Training loss (KL)")
        else:
            ax1.plot([r["step"] for r in train_rows], [r["loss"] for r in train_rows], color="#c44e52")
            ax1.set_ylabel("soft cross-entropy (nats)")
            ax1.set_title("Training loss (CE, with the\ntarget's entropy in it)")
        ax1.set_xlabel("step")
        steps = max((len(r.get("acc") or []) for r in train_rows), default=0)
        for k in range(steps):  # TTT step k drafts position k + 1: named as the acceptance plot names them
            ax2.plot([r["step"] for r in train_rows], [(r.get("acc") or [None] * steps)[k] for r in train_rows],
                     label=f"draft position {k + 1}")
        ax2.set_xlabel("step")
        ax2.set_ylabel("accuracy (unconditional)")
        ax2.set_title(f"Accuracy per draft position, K={steps}")
        if steps:
            ax2.legend(fontsize=7)
        out["Training"] = fig

    if report.acceptance_measured or report.acceptance_estimated:
        fig, ax = plt.subplots(figsize=(5, 3))
        if report.acceptance_measured:
            xs = range(1, len(report.acceptance_measured) + 1)
            ax.plot(list(xs), report.acceptance_measured, "o-", label="measured (speculative decoding)")
        if report.acceptance_estimated:
            xs = range(1, len(report.acceptance_estimated) + 1)
            ax.plot(list(xs), report.acceptance_estimated, "s--", label="simulated on held-out states")
        ax.set_xticks(range(1, max(len(report.acceptance_measured), len(report.acceptance_estimated)) + 1))
        ax.set_xlabel("draft position")
        ax.set_ylabel("P(accepted)")
        ax.set_ylim(0, 1)
        k = max(len(report.acceptance_measured), len(report.acceptance_estimated))
        ax.set_title(f"Acceptance per draft position, K={k}")
        ax.legend(fontsize=7)
        out["Acceptance"] = fig
    return out


def k_note(report: DemoReport) -> str | None:
    """Return why the training plot and the acceptance plot count different draft positions, or None
    where they count the same."""
    train_rows = [r for r in report.train_log if "loss" in r and r.get("split", "train") == "train"]
    trained = max((len(r.get("acc") or []) for r in train_rows), default=0)
    measured = report.eval_steps or max(len(report.acceptance_measured), len(report.acceptance_estimated))
    if not trained or not measured or trained == measured:
        return None
    return (f"The draft was trained to predict {trained} positions ahead (K={trained}, its training-time test steps) "
            f"and is measured drafting {measured} tokens a round (K={measured}, eval's --steps, the chain a server "
            f"would run): " + (f"positions past {measured} are trained but unused at K={measured}."
                               if trained > measured else
                               f"positions past {trained} were never trained, and drafting them costs more than it gains."))


def write_html(report: DemoReport, path: str | Path) -> Path:
    """Write the report page to `path` (atomically); return the path."""
    path = Path(path)
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>curator demo report</title>",
        "<style>body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}"
        "code{background:#f4f4f4;padding:1px 4px;font-size:90%}img{max-width:100%}"
        ".plots{display:flex;flex-wrap:wrap;gap:1em 2em;align-items:flex-start}figure{margin:0}</style></head><body>",
        "<h1>curator demo report</h1>",
        "<p>Every stage ran for real on a tiny target made on the spot (demo data, not a real data set). "
        f"Workdir: <code>{html.escape(str(report.workdir))}</code>.</p>",
    ]
    if report.acceptance_length is not None:
        est = report.acceptance_length_estimated
        k = f", K={report.eval_steps}, at most {report.eval_steps + 1}" if report.eval_steps else ""
        parts.append(
            f"<p><b>Acceptance length</b> (tokens per target forward{k}): measured {report.acceptance_length:.2f}"
            + (f", simulated on held-out states {est:.2f}" if est is not None else "")
            + (f"; weighted by the traffic profile's category shares {report.acceptance_traffic:.2f}"
               if report.acceptance_traffic is not None else "")
            + (f"; on the agentic (tool-calling) prompts {report.acceptance_agentic:.2f}"
               if report.acceptance_agentic is not None else "")
            + "</p>"
        )
    for warning in report.warnings:
        parts.append(f"<p><b>Warning:</b> {html.escape(warning)}</p>")
    parts.append("<h2>Stages</h2><table><tr><th>stage</th><th>seconds</th><th>figures</th><th>command</th></tr>")
    for stage in report.stages:
        figures = "<br>".join(f"{html.escape(k)}: {html.escape(format_value(v))}" for k, v in stage.figures.items())
        parts.append(
            f"<tr><td>{html.escape(stage.name)}</td><td>{stage.seconds:.1f}</td><td>{figures}</td>"
            f"<td><code>{html.escape(stage.command)}</code></td></tr>"
        )
    parts.append("</table>")
    made = plots(report)
    # the two narrow plots first, side by side, then the wide training one under them
    shown = {t: made[t] for t in ("Mix composition", "Acceptance", "Training", *made) if t in made}
    if shown:
        # side by side where the page is wide enough: stacked one under the other, the narrow plots left
        # most of the page empty beside and below them
        parts.append("<h2>Plots</h2><div class='plots'>")
        for title, uri in shown.items():
            parts.append(f"<figure><img alt='{html.escape(title)}' src='{uri}'></figure>")  # each plot has its title
        parts.append("</div>")
        note = k_note(report)
        if note:
            parts.append(f"<p>{html.escape(note)}</p>")
    parts.append("</body></html>")
    return write_text(path, "\n".join(parts))


def summary_rows(report: DemoReport) -> list[tuple[str, str]]:
    """Return the final report's headline rows for the terminal."""
    rows: list[tuple[str, str]] = []
    steps = report.figure("target", "train steps")
    if steps is not None:
        rows.append(("target train steps", str(steps)))
    found = report.figure("scout", "candidates")
    if found is not None:
        rows.append(("candidates found", format_value(found)))
    if report.traffic_shares:
        rows.append(("traffic profile", ", ".join(f"{k} {v:.0%}" for k, v in sorted(report.traffic_shares.items()))))
    if report.mix_counts:
        rows.append(("mix composition", ", ".join(f"{k} {v}" for k, v in sorted(report.mix_counts.items()))))
    tps = report.figure("generate", "output tok/s")
    if tps is not None:
        rows.append(("generation throughput", f"{tps:,.0f} output tok/s"))
    calls = report.figure("generate", "tool calls written")
    if calls is not None:
        rows.append(("tool calls the target wrote", f"{calls} answers to prompts with tools"))
    nbytes = report.figure("hidden-states", "bytes")
    if nbytes is not None:
        rows.append(("hidden states stored", human_bytes(nbytes)))
    train_rows = [r for r in report.train_log if "loss" in r and r.get("split", "train") == "train"]
    if train_rows and train_rows[-1].get("kl") is not None:
        rows.append(("draft training loss (KL to the target)",
                     f"{train_rows[0]['kl']:.3f} -> {train_rows[-1]['kl']:.3f} over {train_rows[-1]['step']} steps"))
        rows.append(("how to read it", "KL = cross-entropy minus the target's own entropy "
                     f"({train_rows[-1]['target_entropy']:.3f} nats): 0 means the draft matches the target's distribution"))
    elif train_rows:
        rows.append(("draft training loss (CE)",
                     f"{train_rows[0]['loss']:.3f} -> {train_rows[-1]['loss']:.3f} over {train_rows[-1]['step']} steps"))
        rows.append(("how to read it", LOSS_NOTE))
    # every acceptance length names its K (the most it can be is K + 1): eval's chain and training's differ
    k = f" (K={report.eval_steps})" if report.eval_steps else ""
    if report.acceptance_length is not None:
        rows.append((f"acceptance length, measured{k}", f"{report.acceptance_length:.2f}"))
    served = report.figure("serve (vLLM)", f"acceptance length, vLLM{k}")
    if served is not None:
        rows.append((f"acceptance length, served by {report.figure('serve (vLLM)', 'engine')}",
                     f"{served:.2f} (curator eval: {report.acceptance_length:.2f})"
                     if report.acceptance_length is not None else f"{served:.2f}"))
    if report.acceptance_traffic is not None:
        rows.append((f"acceptance length, traffic-weighted{k}", f"{report.acceptance_traffic:.2f}"))
    if report.acceptance_agentic is not None:
        rows.append((f"acceptance length, agentic prompts{k}", f"{report.acceptance_agentic:.2f}"))
    if report.acceptance_length_estimated is not None:
        rows.append((f"acceptance length, simulated{k}", f"{report.acceptance_length_estimated:.2f}"))
    evals = [r for r in report.train_log if r.get("split") == "eval" and r.get("sim_accept_length") is not None]
    if evals:
        # a chain of the trainer's TTT steps, which may be longer than eval's K
        sim_k = evals[-1].get("sim_steps")
        rows.append((f"acceptance length, simulated in training{f' (K={sim_k})' if sim_k else ''}",
                     " -> ".join(f"{r['sim_accept_length']:.2f}" for r in evals)))
    if report.warnings:
        rows.append(("warnings", str(len(report.warnings))))
    return rows
