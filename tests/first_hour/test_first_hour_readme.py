"""The README's figures come from the current code: the demo's from the recorded demo run
(bench/results/demo-figures.json), which the suite's own `--quick` demo keeps honest
(tests/curator/demo/test_demo.py compares its figures with the quick run recorded beside the default one).

With CURATOR_DEMO_REPORT=WORKDIR/report.json the README is checked against that run instead:
    curator demo --workdir /tmp/demo --fresh
    CURATOR_DEMO_REPORT=/tmp/demo/report.json python3 -m pytest -q tests/first_hour/test_first_hour_readme.py
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

from bench.demo_figures import RECORD, readme_figures, run_figures
from curator.demo.pipeline import DEMO_THREADS, QUICK, DemoSettings

REPO = Path(__file__).resolve().parents[2]


def _recorded() -> dict:
    return json.loads(RECORD.read_text())


def test_the_readme_quotes_the_demo_figures_of_the_recorded_run() -> None:
    fresh = os.environ.get("CURATOR_DEMO_REPORT")
    if fresh:
        expected = run_figures(json.loads(Path(fresh).read_text()))
    else:
        expected = {k: v for k, v in _recorded()["default"].items() if k not in ("settings", "code", "machine", "stage seconds")}
    quoted = readme_figures((REPO / "README.md").read_text())
    assert quoted == expected, "the README's demo paragraph quotes other figures than the demo run gives"


def test_the_recorded_demo_runs_were_made_with_today_s_settings() -> None:
    # a change of the demo's sizes or threads changes its figures: run it again (bench/demo_figures.py)
    recorded = _recorded()
    assert recorded["torch_threads"] == DEMO_THREADS
    assert recorded["default"]["settings"] == asdict(DemoSettings())
    assert recorded["quick"]["settings"] == asdict(QUICK)


def test_the_readme_figure_reader_notices_a_paragraph_that_lost_its_figures() -> None:
    import pytest

    text = (REPO / "README.md").read_text()
    assert readme_figures(text)
    with pytest.raises(ValueError):
        readme_figures(text.replace("measured an acceptance length of", "measured"))
