"""The demo's report and the training output name each figure one way, with its K (issue 33, item 6),
and report.html's plots fit their axes, carry their values and sit side by side (item 8)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from curator.demo.report import DemoReport, StageResult, summary_rows, write_html

TRAIN_LOG = [
    {"split": "train", "step": s, "loss": 3.0 - s / 20, "kl": 1.0 - s / 40, "target_entropy": 2.0,
     "acc": [0.2 + s / 100, 0.1, 0.05, 0.02]} for s in (10, 20)
] + [{"split": "eval", "step": 20, "loss": 2.1, "acc": [0.5, 0.2, 0.1, 0.05], "sim_accept_length": 4.67, "sim_steps": 4}]


def demo_report(tmp_path: Path) -> DemoReport:
    return DemoReport(workdir=tmp_path, mix_counts={"agentic": 49, "chat": 7, "code": 47, "reasoning": 0},
                      train_log=TRAIN_LOG, acceptance_measured=[0.8, 0.6, 0.4], acceptance_estimated=[0.82, 0.6, 0.45],
                      acceptance_length=3.62, acceptance_length_estimated=3.73, acceptance_agentic=3.23,
                      acceptance_traffic=3.54, eval_steps=3,
                      stages=[StageResult("eval", 1.0, {"simulated (K=3)": 3.73}, "curator eval ...")])


def test_every_acceptance_length_in_the_terminal_report_names_its_k(tmp_path: Path) -> None:
    rows = dict(summary_rows(demo_report(tmp_path)))
    acceptance = {k: v for k, v in rows.items() if k.startswith("acceptance length")}
    assert len(acceptance) == 5
    assert all(re.search(r"\(K=\d\)", k) for k in acceptance), acceptance
    assert rows["acceptance length, simulated (K=3)"] == "3.73"  # not "estimated": one name, as report.html says
    assert rows["acceptance length, simulated in training (K=4)"] == "4.67"
    assert not any("estimated" in k for k in rows)


def test_the_page_names_the_offline_figure_as_the_terminal_does_with_its_k(tmp_path: Path) -> None:
    page = write_html(demo_report(tmp_path), tmp_path / "report.html").read_text()
    headline = re.search(r"<p><b>Acceptance length</b>(.*?)</p>", page).group(1)
    assert "K=3, at most 4" in headline and "simulated on held-out states 3.73" in headline
    assert "offline" not in headline and "estimated" not in headline


@pytest.fixture
def figures(tmp_path: Path):  # type: ignore[no-untyped-def]
    import matplotlib.pyplot as plt

    from curator.demo.report import figures as make

    made = make(demo_report(tmp_path))
    for fig in made.values():
        fig.canvas.draw()
    yield made
    for fig in made.values():
        plt.close(fig)


def test_training_and_acceptance_plots_count_the_same_draft_positions(figures) -> None:  # type: ignore[no-untyped-def]
    _, accuracy = figures["Training"].axes
    labels = [t.get_text() for t in accuracy.get_legend().get_texts()]
    assert labels == ["draft position 1", "draft position 2", "draft position 3", "draft position 4"]
    (acceptance,) = figures["Acceptance"].axes
    assert acceptance.get_xlabel() == "draft position" and [t for t in acceptance.get_xticks()] == [1, 2, 3]
    assert "K=4" in accuracy.get_title() and "K=3" in acceptance.get_title()
    texts = [t.get_text() for fig in figures.values() for ax in fig.axes
             for t in (ax.title, ax.xaxis.label, ax.yaxis.label, *(ax.get_legend().get_texts() if ax.get_legend() else []))]
    assert not any("TTT step" in t for t in texts)


def test_every_plot_title_fits_over_its_axes(figures) -> None:  # type: ignore[no-untyped-def]
    for name, fig in figures.items():
        renderer = fig.canvas.get_renderer()
        for ax in fig.axes:
            title, box = ax.title.get_window_extent(renderer), ax.get_window_extent(renderer)
            assert title.x0 >= box.x0 - 1 and title.x1 <= box.x1 + 1, (name, ax.get_title())


def test_the_mix_bars_carry_their_shares_and_counts_a_missing_category_too(figures) -> None:  # type: ignore[no-untyped-def]
    (ax,) = figures["Mix composition"].axes
    assert sorted(t.get_text() for t in ax.texts) == sorted(["48% (49)", "7% (7)", "46% (47)", "0% (0)"])


def test_the_mix_plot_sets_the_traffic_target_beside_the_achieved_shares(tmp_path: Path) -> None:
    # issue 46 item 7: the plot showed counts, which do not say whether --match reached the profile's shares
    import matplotlib.pyplot as plt

    from curator.demo.report import figures as make

    report = demo_report(tmp_path)
    report.traffic_shares = {"agentic": 0.45, "code": 0.45, "chat": 0.10}
    fig = make(report)["Mix composition"]
    try:
        (ax,) = fig.axes
        assert "target" in ax.get_title() and "achieved" in ax.get_title() and ax.get_ylabel() == "share of prompts"
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["target (traffic profile)", "achieved (mix)"]
        texts = {t.get_text() for t in ax.texts}
        assert {"45%", "10%", "48% (49)", "7% (7)"} <= texts
    finally:
        plt.close(fig)


def test_the_headline_gives_the_traffic_weighted_figure_and_the_page_explains_two_ks(tmp_path: Path) -> None:
    page = write_html(demo_report(tmp_path), tmp_path / "report.html").read_text()
    headline = re.search(r"<p><b>Acceptance length</b>(.*?)</p>", page).group(1)
    assert "weighted by the traffic profile's category shares 3.54" in headline
    # training's accuracy plot counts 4 positions, the acceptance plot 3: the page says why
    assert "K=4" in page[page.index("<div class='plots'>"):] and "trained but unused at K=3" in page


def test_the_narrow_plots_sit_side_by_side_before_the_wide_one(tmp_path: Path) -> None:
    page = write_html(demo_report(tmp_path), tmp_path / "report.html").read_text()
    assert ".plots{display:flex;flex-wrap:wrap" in page
    block = page[page.index("<div class='plots'>"):]
    order = re.findall(r"<img alt='([^']*)'", block)
    assert order == ["Mix composition", "Acceptance", "Training"]


def test_curator_train_names_its_accuracy_table_by_draft_position(
    tiny_target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from curator.cli import main
    from tests.training.train.test_trainer import make_store

    store = make_store(tiny_target, tmp_path / "store", n=12)
    assert main(["train", f"data={store}", f"target={tiny_target}", f"out={tmp_path / 'run'}", "device=cpu",
                 "draft_vocab_size=128", "ttt_steps=3", "max_steps=2", "global_batch_size=2", "micro_batch_size=2",
                 "eval_fraction=0.25", "log_every=1"]) == 0
    err = capsys.readouterr().err
    assert "accuracy per draft position, K=3 (eval)" in err and "TTT step" not in err


def test_the_cross_entropy_title_fits_too(tmp_path: Path) -> None:
    import matplotlib.pyplot as plt

    from curator.demo.report import figures as make

    report = demo_report(tmp_path)
    report.train_log = [{k: v for k, v in r.items() if k != "kl"} for r in TRAIN_LOG]
    fig = make(report)["Training"]
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        for ax in fig.axes:
            title, box = ax.title.get_window_extent(renderer), ax.get_window_extent(renderer)
            assert title.x0 >= box.x0 - 1 and title.x1 <= box.x1 + 1, ax.get_title()
    finally:
        plt.close(fig)
