"""A newcomer without network: the live-Hub commands say in seconds, in one line, that the Hub
cannot be reached, exit non-zero, and leave no catalog or snapshot file behind."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from curator.cli import main
from tests.fakes.hub_server import FakeHubServer

AGENTS_DIR = Path(__file__).resolve().parents[2] / "agents"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def no_hub(monkeypatch: pytest.MonkeyPatch) -> str:
    """HF_ENDPOINT on a port nothing listens on, as a machine without network sees the Hub."""
    url = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return url


def _one_line_error(code: int, capsys: pytest.CaptureFixture[str], started: float) -> str:
    err = capsys.readouterr().err.strip()
    assert code == 1 and time.perf_counter() - started < 10
    assert len(err.splitlines()) == 1 and "Retry" not in err, err
    return err


@pytest.mark.parametrize("planner", ["rules", "llm"])
def test_a_live_hub_scout_without_network_says_so_in_seconds(
    planner: str, no_hub: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # the agents hold a key, but their model server cannot be reached either
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", f"http://127.0.0.1:{_closed_port()}")
    import anthropic  # noqa: F401 - the SDK's import (seconds on a busy machine) is not what is timed

    catalog = tmp_path / "c.duckdb"
    started = time.perf_counter()
    code = main(["scout", "--planner", planner, "--no-live", "--catalog", str(catalog), "--agents-dir", str(AGENTS_DIR),
                 "--recipe-out", str(tmp_path / "r.yaml")])
    err = _one_line_error(code, capsys, started)
    assert f"cannot reach the Hub at {no_hub}" in err and "--hub bundled" in err
    assert not catalog.exists() and not (tmp_path / "r.yaml").exists()


def test_a_hub_that_answers_every_request_with_an_error_fails_the_scout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # a proxy or a wrong HF_ENDPOINT that answers, but never with data: the scout found nothing
    # because of it, which is a failure, not a finished run with no candidates
    with FakeHubServer([]) as hub:
        hub.fail_next("/api/datasets", [404] * 500)
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("CURATOR_VIEWER_URL", hub.url)
        started = time.perf_counter()
        code = main(["scout", "--planner", "rules", "--agents", "2", "--no-live", "--catalog", str(tmp_path / "c.duckdb"),
                     "--agents-dir", str(AGENTS_DIR), "--recipe-out", str(tmp_path / "r.yaml")])
    err = _one_line_error(code, capsys, started)
    assert "no candidates: all" in err and "HTTP 404" in err and not (tmp_path / "r.yaml").exists()


def test_hub_snapshot_without_network_writes_no_file(no_hub: str, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "hub.json"
    started = time.perf_counter()
    code = main(["hub", "snapshot", "--out", str(out), "--query", "swe agent"])
    assert f"cannot reach the Hub at {no_hub}" in _one_line_error(code, capsys, started)
    assert not out.exists()


def test_a_snapshot_with_no_dataset_is_not_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "hub.json"
    with FakeHubServer([]) as hub:
        hub.fail_next("/api/datasets", [404] * 10)
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("CURATOR_VIEWER_URL", hub.url)
        code = main(["hub", "snapshot", "--out", str(out), "--query", "swe agent"])
    err = capsys.readouterr().err
    assert code == 1 and "was not written" in err and "HTTP 404" in err
    assert not out.exists()


def test_a_hub_that_accepts_but_never_answers_is_unreachable_within_the_probe_timeout() -> None:
    from curator.hub import unreachable

    # a black hole (a firewall that drops packets, an unroutable address) as a listener that never answers
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        started = time.perf_counter()
        why = unreachable(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout_s=0.5)
    assert why == "ReadTimeout" and time.perf_counter() - started < 3


@pytest.mark.parametrize("llm", ["anthropic", "openai"])
def test_agents_whose_model_server_cannot_be_reached_say_so_in_seconds(
    llm: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # the Hub is the bundled snapshot; only the agents' model server is out of reach
    closed = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", closed)
    import anthropic  # noqa: F401 - the SDK's import is not what is timed

    catalog = tmp_path / "c.duckdb"
    extra = ["--llm", "openai", "--base-url", f"{closed}/v1", "--model", "m"] if llm == "openai" else []
    started = time.perf_counter()
    code = main(["scout", "--hub", "bundled", "--agents", "2", "--no-live", "--catalog", str(catalog),
                 "--agents-dir", str(AGENTS_DIR), "--recipe-out", str(tmp_path / "r.yaml"), *extra])
    err = _one_line_error(code, capsys, started)
    assert f"cannot reach the agents' model server at {closed}" in err and "--planner rules" in err
    assert not catalog.exists()
