"""At 80 columns (issue 33, item 5): progress tails, eval lines, help text and wrapped table values
read whole. Each check renders at rich's console width 80, or runs the command with COLUMNS=80."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from rich.console import Console
from rich.progress import Progress, TextColumn

from curator.ui import progress, summary_table

REPO = Path(__file__).resolve().parents[2]


def at_80(*renderables: object) -> str:
    out = io.StringIO()
    console = Console(file=out, width=80, color_system=None, force_terminal=False)
    for r in renderables:
        console.print(r)
    return out.getvalue()


def run_at_80(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # this checkout's curator, whichever one the environment installed
    env = {**os.environ, "COLUMNS": "80", "TERM": "dumb", "PYTHONPATH": str(REPO)}
    env.pop("FORCE_COLOR", None)
    return subprocess.run([sys.executable, "-m", "curator", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


TRAIN_STATUS = "KL 0.138  acc 0.97 0.93 0.88  τ 3.42  12,345 tok/s"
GENERATE_STATUS = "41.5 req/s  1,760 tok/s  errors 0  retried 2"


def test_a_progress_tail_that_does_not_fit_goes_whole_onto_its_own_line() -> None:
    bar = progress(TextColumn("{task.fields[status]}"))
    train = bar.add_task("train", total=600, status=TRAIN_STATUS)
    bar.update(train, completed=600)
    bar.add_task("generate", total=1000, completed=500, status=GENERATE_STATUS)
    bar.stop()
    shown = at_80(*bar.get_renderables())
    assert "…" not in shown
    lines = [line.rstrip() for line in shown.splitlines()]
    assert all(len(line) <= 80 for line in lines)
    assert "  " + TRAIN_STATUS in lines and "  " + GENERATE_STATUS in lines  # whole, under their bars
    assert any(line.startswith("train ") and "600/600" in line for line in lines)


def test_a_progress_line_that_fits_stays_one_line() -> None:
    bar = progress(TextColumn("{task.fields[status]}"))
    bar.add_task("train", total=9, completed=9, status="KL 0.1")
    bar.stop()
    lines = [line for line in at_80(*bar.get_renderables()).splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].rstrip().endswith("KL 0.1")


def test_build_mix_shows_each_sources_kept_count_whole(tmp_path: Path) -> None:
    rows = [{"messages": [{"role": "user", "content": f"question {i}: how do I sort {i} items?"}]} for i in range(6)]
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    name = "demo-openthoughts-with-a-long-name"
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump({"name": "narrow", "seed": 0, "sources": [
        {"path": "chat.jsonl", "name": name, "samples": 4, "category": "chat", "format": "messages"}]}))
    done = run_at_80("build-mix", "--recipe", "recipe.yaml", "--out", "mix", "--catalog", "c.duckdb", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    bar_lines = [line for line in done.stderr.splitlines() if "kept 4/4" in line]
    assert bar_lines and all(len(line.rstrip()) <= 80 for line in done.stderr.splitlines())


def test_an_eval_line_breaks_between_figures_never_inside_one() -> None:
    from curator.ui import fit_line

    pieces = ["eval step 600:", "KL 0.138", "acc 0.97 0.93 0.88 0.80", "accept length 3.421", "simulated 3.730"]
    text = fit_line(pieces, 80)
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines) and len(lines) == 2
    assert all(any(piece in line for line in lines) for piece in pieces)  # each label keeps its number


def test_the_training_eval_line_fits_80_columns() -> None:
    from curator.train_progress import training_metrics

    out = io.StringIO()
    bar = Progress(console=Console(file=out, width=80, color_system=None))
    show = training_metrics(bar, "train")
    show({"split": "eval", "step": 600, "loss": 2.5, "target_entropy": 2.362, "acc": [0.97, 0.93, 0.88, 0.80],
          "accept_length": 3.421, "sim_accept_length": 3.73})
    lines = out.getvalue().splitlines()
    assert all(len(line) <= 80 for line in lines)
    assert any("simulated 3.730" in line for line in lines) and any("accept length 3.421" in line for line in lines)


def test_scout_help_gives_its_descriptions_room_at_80_columns(tmp_path: Path) -> None:
    done = run_at_80("scout", "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    options = [line for line in done.stdout.splitlines() if line.startswith("│ --")]
    # the description is the last cell: on the old layout it had ~20 columns ("How many briefs to")
    widths = [len(line.rstrip("│ ").split("  ")[-1]) for line in options]
    assert min(len(line) for line in done.stdout.splitlines() if line.strip()) <= 80
    assert max(widths) >= 35, done.stdout
    assert "--no-live" in done.stdout and "<anthropic|openai>" not in done.stdout


def test_wrapped_text_in_a_summary_table_is_left_aligned_and_numbers_stay_right() -> None:
    rationale = ("Agentic trajectories of SWE-agent solving GitHub issues: tool calls, observations and edits over "
                 "many turns; close to the traffic of coding agents.")
    shown = at_80(summary_table("candidate 3", [("id", 3), ("rationale", rationale), ("relevance", 0.92)]))
    lines = shown.splitlines()
    cells = [line.split("│")[2] for line in lines if line.count("│") == 3]
    wrapped = [c for c in cells if c.strip() and not c.strip()[0].isdigit()]
    assert len(wrapped) >= 2 and all(c.startswith(" ") and not c.startswith("  ") for c in wrapped)  # left
    assert [c for c in cells if c.strip() in ("3", "0.92")][0].startswith("   ")  # numbers right-aligned


def test_catalog_show_at_80_columns_reads_its_rationale_left_aligned(tmp_path: Path) -> None:
    from curator.catalog import Catalog

    rationale = ("Agentic trajectories of SWE-agent solving GitHub issues: tool calls, observations and edits over "
                 "many turns; close to the traffic of coding agents and long enough to need the long budget.")
    with Catalog.open(tmp_path / "c.duckdb") as cat:
        cat.upsert_dataset({"dataset_id": "nebius/SWE-agent-trajectories", "license": "cc-by-4.0", "num_rows": 80036})
        cid = cat.add_candidate("run", "agentic", "nebius/SWE-agent-trajectories", "agentic", 0.95, rationale, 10000)
    done = run_at_80("catalog", "show", str(cid), "--catalog", "c.duckdb", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if "rationale" in line)
    follow = [line.split("│")[2] for line in lines[start + 1:start + 3] if line.count("│") == 3]
    assert follow and all(c.startswith(" ") and c[1] != " " for c in follow if c.strip())


def test_a_bar_of_unknown_length_shows_no_eta_or_rate_placeholders() -> None:
    # profile reads a log to its end and build-mix fills quotas: neither knows its total (issue 46 item 8)
    bar = progress()
    bar.add_task("profiling", total=None, completed=1200)
    bar.stop()
    shown = at_80(*bar.get_renderables())
    assert "1200/?" in shown and "ETA" not in shown and "-/s" not in shown
    known = progress()
    known.add_task("train", total=10, completed=4)
    known.stop()
    assert "ETA" in at_80(*known.get_renderables())


def _eval_report(offline: dict | None) -> object:
    from types import SimpleNamespace

    from training.eval.simulate import AcceptanceStats

    overall, chat = AcceptanceStats(3), AcceptanceStats(3)
    for accepted in ([3, 1, 0, 2, 3]):
        overall.add([accepted])
        chat.add([accepted])
    return SimpleNamespace(overall=overall, categories={"chat": chat}, prompts=[1, 2], skipped={}, new_tokens=40,
                           steps=3, topk=1, offline=offline, sampling=None, ties=0)


def test_eval_without_data_shows_no_empty_simulated_columns_and_no_cut_header_at_80(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from curator import ui
    from curator.commands.evaluate import render_eval

    out = io.StringIO()
    monkeypatch.setattr(ui, "console", Console(file=out, width=80, color_system=None, force_terminal=False))
    monkeypatch.setattr("curator.commands.evaluate.console", ui.console)
    render_eval(_eval_report(None), 1.0)
    shown = out.getvalue()
    assert "simulated" not in shown and "teacher-forc" not in shown and "…" not in shown
    offline = {"samples": 4, "split": "held out 4", "simulated": {"acceptance_length": 1.5, "overall": {
        "per_position": [{"rate": 0.7}, {"rate": 0.5}, {"rate": 0.3}]}, "categories": {}},
        "teacher_forced": {"accept_length": 1.9, "cond_acc": [0.8, 0.7, 0.6]}}
    out.truncate(0)
    out.seek(0)
    render_eval(_eval_report(offline), 1.0)
    shown = out.getvalue()
    assert "teacher-forced" in shown and "…" not in shown and all(len(line) <= 80 for line in shown.splitlines())


def test_plan_prices_its_feeds_with_every_number_whole_at_80_columns(tmp_path: Path) -> None:
    cfg = tmp_path / "kimi.json"
    cfg.write_text(json.dumps({"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
                               "text_config": {"hidden_size": 7168, "num_hidden_layers": 61, "vocab_size": 163840}}))
    done = run_at_80("plan", "--model", str(cfg), "--samples", "100000", "--avg-tokens", "2103", "--epochs", "3",
                     "--cache-budget", "500GB", "--capture-rate", "47000", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    shown = done.stdout + done.stderr
    feeds = shown[shown.index("feeding the trainer"):]
    # the table used to read `210,300,...` and `engine-...` (issue 46 item 3)
    assert "…" not in feeds and all(len(line) <= 80 for line in feeds.splitlines())
    for number in ("210,300,000", "630,900,000", "201,581,453", "12.1 TB", "500.0 GB"):
        assert number in feeds, number
    assert "full store" in feeds and "capture every" in feeds


def test_demo_help_wraps_its_paragraphs_at_80_columns_not_at_the_sources_line_breaks(tmp_path: Path) -> None:
    done = run_at_80("demo", "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    text = done.stdout[: done.stdout.index("Options")]
    paragraphs: list[list[str]] = [[]]
    for line in text.splitlines():  # blank lines (spaces only) separate paragraphs
        if line.strip():
            paragraphs[-1].append(line.strip())
        elif paragraphs[-1]:
            paragraphs.append([])
    # a line that ends a paragraph may be short; any other line short of the width was broken mid-sentence
    for lines in paragraphs:
        assert all(len(line) >= 60 for line in lines[:-1]), lines
    assert any("Hub snapshot" in line for lines in paragraphs for line in lines)


def test_the_scout_view_keeps_dataset_ids_and_states_whole_at_80_columns() -> None:
    from types import SimpleNamespace as NS

    from curator.scout.orchestrator import ScoutRun

    progress = [NS(agent="agent-reasoning-math", domain="Mathematical reasoning and competition problems with worked solutions",
                   turn=3, searches=5, inspections=12, candidates=4, tokens=12345, state="failed",
                   error="the model server said 503 Service Unavailable after 4 attempts")]
    top = [{"dataset_id": "ise-uiuc/Magicoder-Evol-Instruct-110K", "category": "coding", "relevance": 0.93,
            "samples": 110000, "agents": ["agent-reasoning-math"]}]
    run = NS(config=NS(budget=NS(max_turns=8), planner="llm"), progress=progress, run_id="r-1", status="running",
             wall_s=1.0, top_candidates=lambda: top)
    shown = at_80(ScoutRun.render(run))  # type: ignore[arg-type]
    assert "ise-uiuc/Magicoder-Evol-Instruct-110K" in shown and "agent-reasoning-math" in shown
    assert "failed" in shown and "503 Service Unavailable after 4" in shown.replace("\n", " ")
    assert "…" not in shown and all(len(line.rstrip()) <= 80 for line in shown.splitlines())
