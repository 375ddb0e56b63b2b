"""Help and README words a newcomer met in issue 33 (item 7): say what a brief is, what --stop-after
does, name arguments as click does, list every demo stage, suggest the command meant, and state
what the demo and scout actually do."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from curator.cli import main

REPO = Path(__file__).resolve().parents[2]


def help_of(args: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("COLUMNS", "200")  # one line per option: the words, not the wrapping, are checked here
    assert main([*args, "--help"]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("typed, meant", [("buildmix", "build-mix"), ("build_mix", "build-mix"), ("trian", "train"),
                                          ("hiddenstates", "hidden-states")])
def test_a_mistyped_command_gets_the_one_meant(typed: str, meant: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([typed]) == 2
    assert f"Did you mean '{meant}'?" in capsys.readouterr().err


def test_a_command_nothing_like_any_gets_no_guess(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["zzzz"]) == 2
    err = capsys.readouterr().err
    assert "No such command 'zzzz'" in err and "Did you mean" not in err


def test_usage_lines_name_arguments_as_click_does(capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    assert "Usage: curator sql [OPTIONS] STATEMENT" in help_of(["sql"], capsys, monkeypatch)
    assert "Usage: curator catalog show [OPTIONS] CANDIDATE_ID" in help_of(["catalog", "show"], capsys, monkeypatch)
    assert "Usage: curator train [OPTIONS] [KEY=VALUE]..." in help_of(["train"], capsys, monkeypatch)
    forecast = help_of(["forecast"], capsys, monkeypatch)
    assert "<path>..." in forecast and "<Path>" not in forecast


def test_scout_says_what_a_brief_is(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    shown = help_of(["scout"], capsys, monkeypatch)
    assert "one per research domain's brief (agents/*.md)" in shown
    assert "one Markdown file per data domain" in shown


def test_stop_after_says_what_happens_and_how_to_go_on(capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    shown = help_of(["train"], capsys, monkeypatch)
    line = next(line for line in shown.splitlines() if "--stop-after" in line)
    assert "checkpoint" in line and "--resume" in line and "session" not in line


def test_demo_help_lists_every_stage_the_demo_runs(capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from curator.demo.pipeline import Demo

    demo = object.__new__(Demo)  # the stage list only: no workdir made
    demo.serve_python = None  # serve runs only with --serve, which the help's next paragraph and the option describe
    stages = [stage.__name__.replace("_", "-") for stage in demo.stages()]
    stages = ["review" if s == "approve" else "target" if s == "make-target" else s for s in stages]
    listed = help_of(["demo"], capsys, monkeypatch)
    line = next(line for line in listed.splitlines() if "scout ->" in line)
    assert re.findall(r"[\w-]+", line.split("Run", 1)[1].replace("->", " ")) == stages
    assert "With --serve it ends by serving the draft in a real vLLM" in " ".join(listed.split())


def test_the_readme_states_the_demo_traffic_its_profile_reads() -> None:
    from curator.demo.corpus import write_demo_traffic
    from curator.traffic.profile import build_profile

    readme = (REPO / "README.md").read_text()
    said = re.search(r"its profile reads code (\d+)%, agentic (\d+)%", readme)
    assert said is not None and "agentic-heavy" not in readme
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        from curator.demo.pipeline import DemoSettings

        profile = build_profile(write_demo_traffic(Path(tmp) / "t.jsonl", n=DemoSettings().traffic_requests))
    shares = {c: round(100 * e.share) for c, e in profile.categories.items()}
    assert (shares["code"], shares["agentic"]) == (int(said[1]), int(said[2]))


def test_the_readme_and_pyproject_claim_nothing_stale() -> None:
    readme = (REPO / "README.md").read_text()
    assert "retry for about 80 s" not in readme
    assert "stops before its first agent" in readme
    assert "the CPU build on disk" not in (REPO / "pyproject.toml").read_text()


def test_scout_with_an_unreachable_model_server_stops_before_its_first_agent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import socket
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.perf_counter()
    code = main(["scout", "--hub", "bundled", "--llm", "openai", "--base-url", f"http://127.0.0.1:{port}/v1",
                 "--model", "m", "--no-live", "--agents-dir", str(REPO / "agents"), "--catalog", str(tmp_path / "c.duckdb"),
                 "--recipe-out", str(tmp_path / "r.yaml")])
    assert code == 1 and time.perf_counter() - start < 20  # the README's claim: seconds, not 80 s of retries
    assert "cannot reach the agents' model server" in capsys.readouterr().err
