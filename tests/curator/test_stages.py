"""One stage-and-record policy (curator.stages): a stage's output on disk is complete whatever the
catalog says, so a catalog that fails after the stage is a warning naming it (exit 0); a catalog
the stage needs before it starts (`build-mix --from-catalog`) is still an error; a catalog that
works gets the row and the caller gets its id."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import duckdb
import pytest

import curator.generate
import training.train.trainer as trainer
from curator.catalog import Catalog
from curator.cli import main
from curator.errors import CatalogError
from curator.generate import GenerateConfig, GenerationStats
from curator.mix import read_manifest
from curator.mix.recipe import load_recipe
from curator.stages import build_and_record_mix, generate_and_record, record_after, train_and_record
from training.train.config import TrainConfig
from training.train.trainer import TrainResult

HOLDER = textwrap.dedent(
    """
    import sys, time, duckdb
    con = duckdb.connect(sys.argv[1])
    print("holding", flush=True)
    time.sleep(60)
    """
)


def _recipe(folder: Path, rows: int = 12) -> Path:
    """A recipe over one local ShareGPT file of distinct prompts."""
    lines = [json.dumps({"conversations": [{"from": "human", "value": f"question number {i} about sockets and {i * 7} locks"},
                                           {"from": "gpt", "value": "ok"}]}) for i in range(rows)]
    (folder / "chat.jsonl").write_text("\n".join(lines) + "\n")
    recipe = folder / "recipe.yaml"
    recipe.write_text(f"name: stage-mix\nsources:\n  - path: chat.jsonl\n    name: chat\n    samples: {rows}\n")
    return recipe


def _refusing(path: Path, table: str) -> Path:
    """A migrated catalog whose `table` has one column more than curator writes: every record into
    it fails inside DuckDB (a real binder error), while opening the file still works."""
    Catalog.open(path)
    con = duckdb.connect(str(path))
    con.execute(f"ALTER TABLE {table} ADD COLUMN added_by_hand VARCHAR")
    con.close()
    return path


def _rows(catalog: Path, sql: str) -> list[tuple]:
    return Catalog.open(catalog).query(sql)[1]


# -- the policy itself ---------------------------------------------------------------------------------


def test_a_record_that_works_returns_its_id_and_no_warning(tmp_path: Path) -> None:
    recorded = record_after("output", tmp_path / "c.duckdb", lambda cat: "id-1")
    assert (recorded.result, recorded.catalog_id, recorded.warning) == ("output", "id-1", None)


def test_a_record_that_fails_in_duckdb_is_a_catalog_error_naming_the_file(tmp_path: Path) -> None:
    catalog = _refusing(tmp_path / "c.duckdb", "mixes")
    with pytest.raises(CatalogError, match=f"cannot record the mix in catalog {catalog}"):
        Catalog.open(catalog).record_mix("m", tmp_path, {}, {"rows": 1})


def test_a_catalog_failure_after_the_stage_is_a_warning_that_keeps_the_result(tmp_path: Path) -> None:
    def failing(cat: Catalog) -> str:
        raise CatalogError(f"cannot record the mix in catalog {cat.path}: disk says no")

    recorded = record_after({"rows": 3}, tmp_path / "c.duckdb", failing)
    assert recorded.result == {"rows": 3} and recorded.catalog_id is None
    assert recorded.warning is not None and str(tmp_path / "c.duckdb") in recorded.warning
    assert recorded.warning.count(str(tmp_path / "c.duckdb")) == 1  # named once, not twice


def test_a_catalog_that_cannot_be_opened_after_the_stage_is_a_warning_naming_it(tmp_path: Path) -> None:
    broken = tmp_path / "c.duckdb"
    broken.write_bytes(b"this is no duckdb file" * 100)
    recorded = record_after("output", broken, lambda cat: "never")
    assert recorded.catalog_id is None and recorded.warning is not None and str(broken) in recorded.warning


# -- build-mix -----------------------------------------------------------------------------------------


def test_a_mix_is_recorded_and_its_id_is_the_catalog_row(tmp_path: Path) -> None:
    catalog = tmp_path / "c.duckdb"
    recorded = build_and_record_mix(load_recipe(_recipe(tmp_path)), tmp_path / "mix", catalog)
    assert recorded.warning is None and recorded.result["rows"] == 12
    assert _rows(catalog, "SELECT mix_id, name, rows FROM mixes") == [(recorded.catalog_id, "stage-mix", 12)]


def test_a_mix_built_while_another_program_holds_the_catalog_is_on_disk_with_a_warning(tmp_path: Path) -> None:
    catalog = Catalog.open(tmp_path / "c.duckdb")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(catalog.path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        recorded = build_and_record_mix(load_recipe(_recipe(tmp_path)), tmp_path / "mix",
                                        Catalog(catalog.path, lock_wait_s=0.3))
    finally:
        holder.kill()
        holder.wait()
    assert read_manifest(tmp_path / "mix")["rows"] == 12 and recorded.result["rows"] == 12
    assert recorded.catalog_id is None and recorded.warning is not None
    assert str(catalog.path) in recorded.warning and f"PID {holder.pid}" in recorded.warning
    assert _rows(catalog.path, "SELECT count(*) FROM mixes") == [(0,)]


def test_build_mix_whose_catalog_refuses_the_record_exits_0_with_the_mix_and_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    catalog = _refusing(tmp_path / "c.duckdb", "mixes")
    out = tmp_path / "mix"
    assert main(["build-mix", "--recipe", str(_recipe(tmp_path)), "--out", str(out), "--catalog", str(catalog)]) == 0
    printed = capsys.readouterr()
    err = " ".join(printed.err.split())
    assert "warning:" in err and "not recorded in the catalog" in err and str(catalog) in err
    assert "not recorded" in printed.out  # the summary's catalog mix id
    assert read_manifest(out)["rows"] == 12


def test_build_mix_with_an_unreadable_catalog_file_still_builds_from_a_recipe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "c.duckdb"
    broken.write_bytes(b"this is no duckdb file" * 100)
    out = tmp_path / "mix"
    assert main(["build-mix", "--recipe", str(_recipe(tmp_path)), "--out", str(out), "--catalog", str(broken)]) == 0
    assert str(broken) in " ".join(capsys.readouterr().err.split())
    assert read_manifest(out)["rows"] == 12


def test_build_mix_from_a_catalog_that_cannot_be_opened_is_an_error_before_any_mix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "c.duckdb"
    broken.write_bytes(b"this is no duckdb file" * 100)
    out = tmp_path / "mix"
    assert main(["build-mix", "--from-catalog", "--out", str(out), "--catalog", str(broken)]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert err.startswith("error:") and str(broken) in err
    assert not out.exists()


def test_build_mix_whose_license_filter_needs_an_unreadable_catalog_is_an_error_before_any_mix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "c.duckdb"
    broken.write_bytes(b"this is no duckdb file" * 100)
    recipe = _recipe(tmp_path)
    recipe.write_text(recipe.read_text() + "filters:\n  licenses: [apache-2.0]\n")
    out = tmp_path / "mix"
    assert main(["build-mix", "--recipe", str(recipe), "--out", str(out), "--catalog", str(broken)]) == 1
    assert str(broken) in " ".join(capsys.readouterr().err.split())
    assert not out.exists()


def test_build_mix_with_a_working_catalog_prints_the_recorded_mix_id(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    catalog = tmp_path / "c.duckdb"
    assert main(["build-mix", "--recipe", str(_recipe(tmp_path)), "--out", str(tmp_path / "mix"),
                 "--catalog", str(catalog)]) == 0
    printed = capsys.readouterr()
    [(mix_id,)] = _rows(catalog, "SELECT mix_id FROM mixes")
    assert mix_id in printed.out and "warning" not in printed.err


def test_build_mix_asked_for_no_catalog_creates_none_in_the_current_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = _recipe(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.delenv("CURATOR_CATALOG", raising=False)
    assert main(["build-mix", "--recipe", str(recipe), "--out", str(tmp_path / "mix")]) == 0
    printed = capsys.readouterr()
    assert list(work.iterdir()) == [] and read_manifest(tmp_path / "mix")["rows"] == 12
    assert "not recorded: no catalog at catalog.duckdb" in " ".join(printed.out.split()) and "warning" not in printed.err
    # one already there (a scout's) is the default one, and gets the mix
    Catalog.open(work / "catalog.duckdb")
    assert main(["build-mix", "--recipe", str(recipe), "--out", str(tmp_path / "mix")]) == 0
    assert _rows(work / "catalog.duckdb", "SELECT name FROM mixes") == [("stage-mix",)]
    # $CURATOR_CATALOG names one: it is created where it points
    monkeypatch.setenv("CURATOR_CATALOG", str(tmp_path / "env.duckdb"))
    assert main(["build-mix", "--recipe", str(recipe), "--out", str(tmp_path / "mix")]) == 0
    assert _rows(tmp_path / "env.duckdb", "SELECT name FROM mixes") == [("stage-mix",)]


def test_build_mix_from_a_catalog_that_does_not_exist_is_an_error_that_creates_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CURATOR_CATALOG", raising=False)
    assert main(["build-mix", "--from-catalog", "--out", str(tmp_path / "mix")]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert err.startswith("error: no catalog at catalog.duckdb (--from-catalog builds from its approved candidates)")
    assert main(["build-mix", "--from-catalog", "--out", "mix", "--catalog", str(tmp_path / "named.duckdb")]) == 1
    assert f"no catalog at {tmp_path / 'named.duckdb'}" in " ".join(capsys.readouterr().err.split())
    assert list(tmp_path.iterdir()) == []
    # a recipe's license filter reads the catalog too: none there is an error, not an empty catalog made
    recipe = _recipe(tmp_path)
    recipe.write_text(recipe.read_text() + "filters:\n  licenses: [apache-2.0]\n")
    assert main(["build-mix", "--recipe", str(recipe), "--out", "mix"]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "no catalog at catalog.duckdb (the recipe's license filter reads the datasets' licenses from it)" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chat.jsonl", "recipe.yaml"]


# -- generate ------------------------------------------------------------------------------------------


def _fake_generate(monkeypatch: pytest.MonkeyPatch, status: str = "done") -> None:
    """Stand in for the generate stage: it writes its output and returns its stats, as the real one does."""

    def generate(config: GenerateConfig, on_progress: object = None) -> GenerationStats:
        config.out.mkdir(parents=True, exist_ok=True)
        (config.out / "shard-00000.jsonl").write_text('{"id": "q1"}\n')
        return GenerationStats(run_id="gen-run-1", model=config.model, backend=config.backend,
                               endpoints=list(config.endpoints), mix_rows=1, generated=1, done_total=1, status=status)

    monkeypatch.setattr(curator.generate, "generate", generate)


def _generate_config(tmp_path: Path) -> GenerateConfig:
    return GenerateConfig(mix=tmp_path / "mix", out=tmp_path / "gen", model="m", endpoints=["http://127.0.0.1:9"])


def test_a_generation_run_is_recorded_under_its_run_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_generate(monkeypatch)
    catalog = tmp_path / "c.duckdb"
    recorded = generate_and_record(_generate_config(tmp_path), catalog)
    assert (recorded.catalog_id, recorded.warning) == ("gen-run-1", None)
    assert _rows(catalog, "SELECT run_id, model, out_dir FROM generation_runs") == [("gen-run-1", "m", str(tmp_path / "gen"))]


def test_a_generation_run_the_catalog_refuses_keeps_its_answers_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_generate(monkeypatch)
    catalog = _refusing(tmp_path / "c.duckdb", "generation_runs")
    recorded = generate_and_record(_generate_config(tmp_path), catalog)
    assert (tmp_path / "gen" / "shard-00000.jsonl").exists() and recorded.result.run_id == "gen-run-1"
    assert recorded.catalog_id is None and recorded.warning is not None and str(catalog) in recorded.warning


def test_generate_whose_catalog_refuses_the_record_exits_0_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _fake_generate(monkeypatch)
    catalog = _refusing(tmp_path / "c.duckdb", "generation_runs")
    code = main(["generate", "--mix", str(tmp_path / "mix"), "--out", str(tmp_path / "gen"), "--model", "m",
                 "--endpoint", "http://127.0.0.1:9", "--catalog", str(catalog)])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 0 and "warning:" in err and "not recorded in the catalog" in err and str(catalog) in err
    assert (tmp_path / "gen" / "shard-00000.jsonl").exists()


def test_a_generation_run_asked_for_no_catalog_creates_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_generate(monkeypatch)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.delenv("CURATOR_CATALOG", raising=False)
    recorded = generate_and_record(_generate_config(tmp_path), None)
    assert (recorded.catalog_id, recorded.warning) == (None, None) and recorded.note is not None
    assert list(work.iterdir()) == [] and recorded.result.run_id == "gen-run-1"


# -- train ---------------------------------------------------------------------------------------------


def _fake_train(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stand in for the trainer: it writes a checkpoint and returns where, as the real one does."""

    def train(cfg: TrainConfig, **kwargs: object) -> TrainResult:
        run = Path(cfg.out)
        (run / "checkpoint-3").mkdir(parents=True, exist_ok=True)
        return TrainResult(run_dir=run, checkpoint=run / "checkpoint-3", step=3, vocab={"coverage": 0.5})

    monkeypatch.setattr(trainer, "train", train)


def test_a_training_run_is_recorded_under_its_run_folder_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_train(monkeypatch)
    catalog = tmp_path / "c.duckdb"
    recorded = train_and_record(TrainConfig(data="s", target="t", out=str(tmp_path / "run-a")), catalog)
    assert (recorded.catalog_id, recorded.warning) == ("run-a", None)
    assert _rows(catalog, "SELECT run_id, out_dir FROM training_runs") == [("run-a", str(tmp_path / "run-a"))]


def test_a_training_run_not_asked_to_record_leaves_the_catalog_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_train(monkeypatch)
    catalog = tmp_path / "c.duckdb"
    recorded = train_and_record(TrainConfig(data="s", target="t", out=str(tmp_path / "run-b")), catalog, record=False)
    assert (recorded.catalog_id, recorded.warning) == (None, None) and recorded.result.step == 3
    assert not catalog.exists()  # a torchrun rank other than 0 does not even open it


def test_train_whose_catalog_refuses_the_record_exits_0_with_the_checkpoint_and_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _fake_train(monkeypatch)
    catalog = _refusing(tmp_path / "c.duckdb", "training_runs")
    code = main(["train", "data=s", "target=t", f"out={tmp_path / 'run-c'}", "--catalog", str(catalog)])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 0 and "warning:" in err and "not recorded in the catalog" in err and str(catalog) in err
    assert (tmp_path / "run-c" / "checkpoint-3").is_dir()
