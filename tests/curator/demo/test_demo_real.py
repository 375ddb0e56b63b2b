"""`curator demo --real`: its wiring on the prompt-package fixtures (wheels made here, their checksums
pinned for the test), in seconds. The full run on SmolLM2 is a bench (bench/results/demo-real-*.json)."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import pytest

from curator.cli import main
from curator.demo.real import REAL, RealDemo, RealSettings, prompt_sets, real_record, timing_table
from curator.demo.report import StageResult
from curator.rows import packages
from curator.rows.schema import MANIFEST, MixRow, open_mix
from curator.ui import console

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "prompts"
# the fixtures hold 2 rows of each file: one for the traffic, the rest for the mix
TINY = RealSettings(
    rows_per_source=0, traffic_requests=0, target_hidden=0, target_layers=0, target_vocab=0, target_steps=0,
    gen_max_tokens=8, train_steps=1, train_batch=1, train_max_length=64, eval_prompts=2, eval_max_new_tokens=4,
    humaneval=2, mtbench=2, ifbench=2, bfcl=2, sharegpt=2, traffic_humaneval=1, traffic_mtbench=1,
    traffic_ifbench=1, traffic_sharegpt=1, traffic_samples=2,
)


def _wheels(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Write a wheel of each prompt package from the fixtures, and pin its checksum for the test."""
    folder.mkdir(parents=True)
    for p in prompt_sets(TINY):
        name, version = p.requirement.split("==")
        top = p.member.split("/")[0]
        wheel = folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as z:
            for f in sorted((FIXTURES / top).rglob("*")):
                if f.is_file():
                    z.write(f, f.relative_to(FIXTURES).as_posix())
        monkeypatch.setitem(packages.PINS, p.requirement, hashlib.sha256(wheel.read_bytes()).hexdigest())


@pytest.fixture
def demo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RealDemo:
    monkeypatch.setenv("CURATOR_CACHE", str(tmp_path / "cache"))
    _wheels(tmp_path / "wheels", monkeypatch)
    d = RealDemo(tmp_path / "work", TINY, wheels=[tmp_path / "wheels"])
    d.w.mkdir()
    return d


def test_the_traffic_and_the_mix_come_from_the_packages_with_the_traffic_held_out(demo: RealDemo) -> None:
    demo.packages()
    demo.profile()
    demo.build_mix()

    traffic = [json.loads(line) for line in (demo.w / "traffic.jsonl").read_text().splitlines()]
    # one first user turn from each set that feeds the traffic; no tools (SmolLM2's template renders none)
    assert len(traffic) == 4 and all(list(t) == ["messages"] and [m["role"] for m in t["messages"]] == ["user"]
                                     for t in traffic)
    assert any(t["messages"][0]["content"].startswith("Complete the following Python function.") for t in traffic)

    recipe = demo.recipe()
    assert [s.get("package") for s in recipe["sources"][:-1]] == [p.requirement for p in prompt_sets(TINY)]
    assert recipe["sources"][-1]["format"] == "traffic" and recipe["sources"][-1]["heldout"] == TINY.eval_prompts

    manifest = json.loads((demo.w / "mix" / MANIFEST).read_text())
    kept = {s["name"]: s["kept"] for s in manifest["sources"]}
    assert kept["bfcl-simple-python"] == 2 and kept["humaneval"] >= 1 and kept["sharegpt"] >= 1
    heldout = [r for r in open_mix(demo.w / "mix" / ".heldout").rows() if isinstance(r, MixRow)]
    assert len(heldout) == TINY.eval_prompts
    mixed = [r for r in open_mix(demo.w / "mix").rows() if isinstance(r, MixRow)]
    # a held-out traffic prompt is never in the mix, from the traffic or from its package
    held_texts = {json.dumps(r.messages[0]) for r in heldout}
    assert not held_texts & {json.dumps(r.messages[0]) for r in mixed}
    assert sum(bool(r.tools) for r in mixed) == 2  # BFCL's, which generate will mark tools_dropped


def test_the_target_is_a_link_to_the_cached_folder_and_fresh_removes_the_link_only(
        demo: RealDemo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cached = tmp_path / "cache" / "targets" / "smollm2"
    cached.mkdir(parents=True)
    (cached / "config.json").write_text("{}")
    monkeypatch.setattr("curator.targets.registry.known_target", lambda name, wheels=None: (cached, False))
    demo.make_target()
    assert (demo.w / "target").is_symlink() and (demo.w / "target").resolve() == cached.resolve()
    assert demo.report.stages[-1].figures["made now"] == "no (cached)"

    again = RealDemo(demo.w, TINY, fresh=True)
    again._load_state()  # --fresh: what the demo made goes, the cache it linked to stays
    assert not (demo.w / "target").exists() and not (demo.w / "target").is_symlink()
    assert (cached / "config.json").is_file()


def test_the_draft_trains_on_a_smaller_vocabulary_than_the_toys(demo: RealDemo) -> None:
    config = demo.train_config()
    assert config["draft_vocab_size"] == TINY.draft_vocab < 32000
    assert config["max_steps"] == TINY.train_steps


def test_the_run_ends_with_where_the_time_went_and_a_record(demo: RealDemo) -> None:
    r = demo.report
    r.stages += [StageResult("generate", 300.0, {}, "cmd"), StageResult("eval", 100.0, {}, "cmd"),
                 StageResult("serve (vLLM)", 100.0, {"engine": "vLLM 0.32.0", "acceptance length, vLLM (K=3)": 1.3,
                                                      "acceptance length, curator eval (K=3)": 1.3}, "cmd")]
    r.acceptance_length, r.acceptance_length_estimated, r.eval_steps = 1.3, 1.25, 3
    with console.capture() as captured:
        console.print(timing_table(r.stages, 520.0))
    out = captured.get()
    assert "wall 520 s" in out and "300.0" in out and "60%" in out and "500.0" in out
    record = real_record(demo, 520.0)
    assert record["acceptance"]["measured"] == 1.3 and record["acceptance"]["simulated"] == 1.25
    assert record["acceptance"]["engine"]["acceptance length, vLLM (K=3)"] == 1.3
    assert [s["name"] for s in record["stages"]] == ["generate", "eval", "serve (vLLM)"]
    json.dumps(record, default=str)  # what finish() writes


def test_the_real_defaults_cap_what_a_135m_model_on_two_cores_costs() -> None:
    # generation is the cost (about 60 output tok/s on one core): the answers are capped
    assert REAL.gen_max_tokens <= 64 and REAL.eval_prompts <= 64
    rows = sum(p.samples for p in prompt_sets(REAL)) + REAL.traffic_samples
    assert 100 <= rows <= 400


def test_real_with_quick_or_wheels_without_real_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--real", "--quick", "--workdir", str(tmp_path / "w")]) == 1
    assert "--real and --quick" in capsys.readouterr().err
    assert main(["demo", "--quick", "--wheels", str(tmp_path), "--workdir", str(tmp_path / "w")]) == 1
    assert "--wheels is for --real" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()
