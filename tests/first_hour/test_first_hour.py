"""A newcomer's first hour with the CLI: it starts fast, every flag says what it does, and its
output reads at 80 columns and in a log file."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from rich.progress import TextColumn

import curator.ui as ui
from curator.catalog import Catalog
from curator.cli import COMMANDS, main

REPO = Path(__file__).resolve().parents[2]


def _run(args: list[str], cwd: Path | None = None, **env: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run `python -m curator ARGS`; return the result and the CPU seconds it used."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-m", "curator", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "80", **env})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return done, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


@pytest.mark.parametrize("args", [["--help"], ["train"], ["generate"], ["doctor"], ["eval"]],
                         ids=["help", "train-without-arguments", "generate-usage", "doctor-usage", "eval-usage"])
def test_help_and_a_usage_error_come_without_loading_torch(args: list[str]) -> None:
    # CPU seconds, not wall time: the machine is shared, and a busy neighbour must not fail this
    done, cpu_s = _run(args)
    assert cpu_s < 1.5, f"curator {' '.join(args)} took {cpu_s:.2f} s of CPU"
    if args == ["train"]:
        assert done.returncode == 1 and "set data, target, out" in done.stderr
    elif args != ["--help"]:
        assert done.returncode == 2 and "Missing option" in done.stderr


def test_building_the_app_and_listing_every_command_imports_no_model_code() -> None:
    code = ("import sys, contextlib, io; from curator.cli import build_app, main; build_app(); "
            "out = io.StringIO(); ctx = contextlib.redirect_stdout(out); ctx.__enter__(); main(['--help']); "
            "ctx.__exit__(None, None, None); print(sorted(m for m in ('torch', 'transformers', 'pyarrow') "
            "if m in sys.modules), all(n in out.getvalue() for n in %r))" % (list(COMMANDS),))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "80"}).stdout
    assert out.strip().splitlines()[-1] == "[] True"


HELP_PAGES = [*COMMANDS, "catalog list", "catalog show", "catalog approve", "catalog reject", "hub snapshot"]


@pytest.mark.parametrize("page", HELP_PAGES)
def test_every_flag_has_help_and_no_type_placeholder_at_80_columns(
    page: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    assert main([*page.split(), "--help"]) == 0
    text = capsys.readouterr().out
    assert "<bool>" not in text and "<list[" not in text
    assert " range>" not in text and "[x>=" not in text and "[x<=" not in text
    assert "…" not in text, "a help text was cut at 80 columns"

    import typer
    from typer.main import get_command

    from curator.cli import build_app

    group = get_command(build_app())
    command = group.get_command(typer.Context(group), page.split()[0])
    for name in page.split()[1:]:
        command = command.get_command(typer.Context(command), name)
    for param in command.params:
        if param.param_type_name == "option":
            assert (param.help or "").strip(), f"curator {page} {param.opts[0]} has no help"


def test_the_scout_goal_default_and_the_train_usage_read_in_a_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["scout", "--help"]) == 0
    text = capsys.readouterr().out
    goal = text[text.index("--goal"):text.index("--planner")]
    assert len(goal.splitlines()) <= 6, goal  # the default goal in full took 20 lines
    assert main(["train", "--help"]) == 0
    lines = [line.strip() for line in capsys.readouterr().out.splitlines()]
    assert "Usage: curator train [OPTIONS] [KEY=VALUE]..." in lines  # it read [[KEY=VALUE]...]...


def test_sql_prints_every_statement_s_result(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    catalog = tmp_path / "c.duckdb"
    assert main(["sql", "select 1 AS first; select 2 AS second", "--catalog", str(catalog), "-f", "csv"]) == 0
    assert capsys.readouterr().out == "first\n1\n\nsecond\n2\n"
    assert main(["sql", "select 1 AS a; select 2 AS b", "--catalog", str(catalog), "-f", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == [[{"a": 1}], [{"b": 2}]]


def test_sql_markdown_is_a_table_a_page_can_hold(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sql", "select 'a|b' AS x, 'two\nlines' AS y", "--catalog", str(tmp_path / "c.duckdb"),
                 "--format", "markdown"]) == 0
    assert capsys.readouterr().out == "| x | y |\n|---|---|\n| a\\|b | two lines |\n"


def test_an_empty_statement_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sql", "", "--catalog", str(tmp_path / "c.duckdb")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: no SQL given") and "\n" not in err


def test_a_query_over_files_creates_no_catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CURATOR_CATALOG", raising=False)
    pq.write_table(pa.table({"category": ["chat", "code", "chat"]}), tmp_path / "part-00000.parquet")
    assert main(["sql", "SELECT category, count(*) AS n FROM 'part-*.parquet' GROUP BY 1 ORDER BY 1", "-f", "csv"]) == 0
    assert capsys.readouterr().out == "category,n\nchat,2\ncode,1\n"
    assert not (tmp_path / "catalog.duckdb").exists()
    assert main(["sql", "SELECT * FROM candidates"]) == 1  # the catalog is not there: say so, create nothing
    assert "no catalog" in capsys.readouterr().err and not (tmp_path / "catalog.duckdb").exists()


def _render(renderable: object, width: int = 80) -> list[str]:
    console = Console(width=width, record=True, file=open(os.devnull, "w"))
    console.print(renderable)
    return console.export_text().rstrip("\n").splitlines()


WIDE_COLUMNS = ["dataset_id", "findings", "agents", "best_relevance", "category", "suggested_samples", "approved",
                "rationales", "license", "downloads", "num_rows"]
LONG_IDS = ["nvidia/Nemotron-Post-Training-Dataset-v1", "nvidia/Nemotron-Post-Training-Dataset-v2",
            "m-a-p/CodeFeedback-Filtered-Instruction"]


def test_a_result_too_wide_for_80_columns_folds_to_one_block_per_row_with_ids_whole() -> None:
    rows = [[dataset_id, 2, 2, 0.85, "agentic", 1_000_000, False, "why " * 200, "apache-2.0", 1234567, 80036]
            for dataset_id in LONG_IDS]
    lines = _render(ui.compact_table(WIDE_COLUMNS, rows))
    assert all(len(line) <= 80 for line in lines)
    assert sum("record" in line for line in lines) == len(LONG_IDS)
    for dataset_id in LONG_IDS:  # ids that differ only at their end stay apart
        assert any(line.split() == ["dataset_id", dataset_id] for line in lines)
    assert ["suggested_samples", "1,000,000"] in [line.split() for line in lines]  # headers and counts whole
    first = lines[: next(i for i, line in enumerate(lines) if line.startswith("license"))]
    rationale = [line for line in first if "why" in line]  # free text is cut after a few lines
    assert 1 < len(rationale) <= ui.CompactTable.RECORD_TEXT_LINES and rationale[-1].endswith("…")


def test_a_result_that_fits_stays_one_line_per_row_cutting_only_free_text() -> None:
    rows = [[dataset_id, 1_000_000, "a long free-text rationale " * 5] for dataset_id in LONG_IDS]
    lines = _render(ui.compact_table(["dataset_id", "samples", "rationale"], rows))
    assert len(lines) == 2 + len(LONG_IDS) and all(len(line) <= 80 for line in lines)
    assert lines[0].split() == ["dataset_id", "samples", "rationale"]
    for line, dataset_id in zip(lines[2:], LONG_IDS):
        assert line.split()[:2] == [dataset_id, "1,000,000"] and line.endswith("…")


def test_sql_results_of_the_catalog_keep_their_ids_at_80_columns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    catalog = Catalog.open(tmp_path / "c.duckdb")
    for i, dataset_id in enumerate(LONG_IDS):
        catalog.add_candidate("run", f"agent-{i}", dataset_id, "agentic", 0.9 - i / 10, "fits " * 40, 5000)
    monkeypatch.setattr(ui.stdout, "width", 80)
    assert main(["sql", "SELECT * FROM candidate_summary ORDER BY best_relevance DESC",
                 "--catalog", str(tmp_path / "c.duckdb")]) == 0
    out = capsys.readouterr().out
    assert all(len(line) <= 80 for line in out.splitlines())
    assert all(f"dataset_id         {dataset_id}\n" in out for dataset_id in LONG_IDS)


def test_catalog_list_shows_whole_dataset_ids_at_80_columns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    catalog = Catalog.open(tmp_path / "c.duckdb")
    ids = ["nvidia/OpenCodeInstruct", "m-a-p/CodeFeedback-Filtered-Instruction", "glaiveai/glaive-function-calling-v2"]
    for i, dataset_id in enumerate(ids):
        catalog.add_candidate("run", f"agent-{i}", dataset_id, "multilingual-code", 0.9 - i / 10, "fits", 5000)
    catalog.approve(1, 1_000_000)
    monkeypatch.setattr(ui.stdout, "width", 80)
    assert main(["catalog", "list", "--catalog", str(tmp_path / "c.duckdb")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert all(len(line) <= 80 for line in lines) and "…" not in "".join(lines)
    rows = [line.split() for line in lines if line.split()[:1] in (["1"], ["2"], ["3"])]
    assert [r[1] for r in rows] == ids and rows[0][-2:] == ["1,000,000", "approved"] and rows[1][-1] == "proposed"
    assert lines[-1].startswith("not shown at 80 columns: category")
    monkeypatch.setattr(ui.stdout, "width", 120)
    assert main(["catalog", "list", "--catalog", str(tmp_path / "c.duckdb")]) == 0
    assert "multilingual-code" in capsys.readouterr().out


def test_a_progress_line_keeps_done_total_and_eta_at_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ui.console, "width", 80)
    bar = ui.progress(TextColumn("{task.fields[status]}"))
    task = bar.add_task("train", total=150, status="CE 20.123  acc 0.41 0.30 0.22  τ 1.93  12,345 tok/s")
    bar.update(task, completed=40)
    # what does not fit beside the bar goes whole onto its own line under it (issue 33 item 5)
    first, *rest = _render(bar.get_renderable())
    assert "40/150" in first and "ETA" in first and all(len(line) <= 80 for line in (first, *rest))
    assert any("CE 20.123  acc 0.41 0.30 0.22  τ 1.93  12,345 tok/s" in line for line in (first, *rest))


def test_errors_are_one_line_in_a_log_file(tmp_path: Path) -> None:
    long_name = "a_table_whose_name_alone_is_longer_than_eighty_columns_of_a_terminal_" * 2
    done, _ = _run(["sql", f"SELECT * FROM {long_name}"], cwd=tmp_path)
    assert done.returncode == 1
    assert len(done.stderr.strip().splitlines()) == 1 and long_name in done.stderr


def test_the_disk_plan_is_printed_on_stdout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"hidden_size": 7168, "num_hidden_layers": 61, "vocab_size": 163840}))
    assert main(["plan", "--model", str(config), "--samples", "100000", "--avg-tokens", "2103"]) == 0
    captured = capsys.readouterr()
    assert "hidden-state disk plan" in captured.out and "12.1 TB" in captured.out
    assert "12.1 TB" not in captured.err


def test_the_training_loss_is_named_for_what_it_is() -> None:
    from curator.commands.train import LOSS_NOTE, loss_text

    assert loss_text({"loss": 20.25}) == "CE 20.250"
    assert loss_text({"loss": 20.25, "target_entropy": 19.75}) == "KL 0.500"
    assert "entropy" in LOSS_NOTE


def test_torch_threads_follow_the_cpus_this_process_may_use(monkeypatch: pytest.MonkeyPatch) -> None:
    from curator import cpu

    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1, 2, 3})
    assert cpu.torch_threads() == 4 and cpu.torch_threads(processes=2) == 2 and cpu.torch_threads(processes=8) == 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert cpu.torch_threads() == 1


def test_the_readme_points_only_inside_the_repo_and_quotes_the_plan() -> None:
    readme = (REPO / "README.md").read_text()
    assert "../shared" not in readme and "shared/REFERENCE" not in readme and "DESIGN.md" not in readme
    # the set-up says what a machine without a GPU and one with a GPU install instead of the pin
    assert "download.pytorch.org/whl/cpu" in readme and "NVIDIA GPU" in readme
    assert "12.1 TB" in readme  # what `curator plan` prints for 100K Kimi-K2.5 samples (test above)
    index = (REPO / "docs" / "README.md").read_text()
    for page in ("reference.md", "mix.md", "generation.md", "engines.md", "training.md", "http.md", "acceptance.md"):
        assert f"]({page})" in index
    assert (REPO / "docs" / "reference.md").is_file()
