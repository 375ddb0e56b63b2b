"""The CLI's error contract: bad input is one line and a non-zero exit, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from curator.cli import main


@pytest.mark.parametrize(
    "argv, says",
    [
        (["train", "--stop-after", "fast"], "Invalid value for '--stop-after'"),
        (["no-such-command"], "No such command"),
        (["build-mix"], "Missing option '--out'"),
    ],
)
def test_usage_errors_exit_2_with_the_reason(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


def test_a_damaged_mix_file_is_one_line_not_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mix = tmp_path / "mix"
    mix.mkdir()
    (mix / "part-00000.parquet").write_bytes(b"not parquet at all")
    code = main(["generate", "--mix", str(mix), "--out", str(tmp_path / "gen"), "--model", "m",
                 "--endpoint", "http://127.0.0.1:9", "--catalog", str(tmp_path / "c.duckdb")])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err and err.strip().startswith("error:")


def test_bad_recipe_creates_no_catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CURATOR_CATALOG", raising=False)
    assert main(["build-mix", "--recipe", str(tmp_path / "missing.yaml"), "--out", "mix"]) == 1
    assert not (tmp_path / "catalog.duckdb").exists()
    assert "missing.yaml" in capsys.readouterr().err


def test_an_unexpected_failure_is_one_line_and_the_traceback_is_on_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import curator.commands.catalog as catalog_commands

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(catalog_commands, "run_sql", broken)
    monkeypatch.delenv("CURATOR_DEBUG", raising=False)
    assert main(["sql", "SELECT 1"]) == 1
    err = capsys.readouterr().err
    assert "unexpected RuntimeError: disk on fire" in err and "Traceback" not in err
    monkeypatch.setenv("CURATOR_DEBUG", "1")
    assert main(["sql", "SELECT 1"]) == 1
    assert "Traceback" in capsys.readouterr().err


def test_every_command_is_listed_without_importing_it_and_routed_to_its_module() -> None:
    import typer
    from typer.main import get_command

    from curator.cli import COMMAND_HELP, COMMANDS, build_app

    group = get_command(build_app())
    ctx = typer.Context(group)
    assert group.list_commands(ctx) == list(COMMANDS) and set(COMMAND_HELP) == set(COMMANDS)
    for name in COMMANDS:
        command = group.get_command(ctx, name)
        assert command is not None and command.name == name
        # what `curator --help` lists without importing the module is the command's own first line
        assert COMMAND_HELP[name] == (command.help or "").strip().splitlines()[0], name


def test_a_catalog_command_does_not_import_the_model_side(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = (
        "import sys; from curator.cli import main; "
        f"rc = main(['sql', 'select 42 AS answer', '--catalog', {str(tmp_path / 'c.duckdb')!r}]); "
        "print('torch' in sys.modules, 'transformers' in sys.modules, rc)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "False False 0"
