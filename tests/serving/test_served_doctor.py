"""The doctor against the engine: each mistake it names on a vLLM launch, started in the real vLLM.

For every case the real engine is started the mistaken way and what it does is recorded: it refuses
at start-up, dies on the first request, or serves (then at what acceptance, on the held-out prompts,
greedy). The doctor must call each of these launches an error, and the engine must indeed not serve
the draft as trained: a refusal, a crash, or an acceptance clearly below the correct launch's
(`curator eval`'s on the same prompts). docs/engines.md tabulates the outcomes.
"""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path
from typing import Any

import httpx

from serving_fixtures import STEPS, engine_acceptance, heldout_prompt_ids, toolkit_acceptance
from vllm_process import ServerFailed, VllmServer


def with_config(src: Path, out: Path, **changes: Any) -> Path:
    """A copy of the export `src` whose config.json has `changes` at the top level."""
    shutil.copytree(src, out)
    config = json.loads((out / "config.json").read_text())
    config.update(changes)
    (out / "config.json").write_text(json.dumps(config, indent=1))
    return out


def outcome(server: VllmServer, prompts: list[tuple[str, list[int]]]) -> dict[str, Any]:
    """What the engine does with the launch (started already): refused, crashed on a request, or served
    (with its acceptance). The server is stopped whatever it did."""
    try:
        try:
            server.wait_ready()
        except ServerFailed:
            return {"engine": "refuses", "detail": last_error(server.log_tail(20000))}
        try:
            got = engine_acceptance(server, prompts)
        except (ServerFailed, httpx.HTTPError):
            return {"engine": "crashes", "detail": last_error(server.log_tail(20000))}
        return {"engine": "serves", "acceptance_length": got["acceptance_length"], "per_position": got["per_position"]}
    finally:
        server.stop()


def last_error(log: str) -> str:
    lines = [ln for ln in log.splitlines() if "Value error" in ln or "Error:" in ln]
    return (lines[-1] if lines else log.splitlines()[-1] if log else "")[-400:]


# the launches vLLM refuses in its argument checks, before it builds an engine (seconds, not a whole start)
REFUSED_AT_START = ("method eagle for an EAGLE-3 draft", "num_speculative_tokens 0")


def cases(demo: Path, tmp: Path) -> dict[str, tuple[Path, dict[str, Any]]]:
    """Mistaken launches: name -> (the draft folder, its --speculative-config)."""
    export = demo / "export"
    n = json.loads((demo / "target" / "config.json").read_text())["num_hidden_layers"]
    trained = json.loads((export / "config.json").read_text())["curator"]["aux_layer_inputs"]
    shifted = [i - 1 for i in trained]  # the SpecForge numbering (layer outputs) written where vLLM reads inputs
    return {
        "method eagle for an EAGLE-3 draft": (export, {"method": "eagle", "model": str(export), "num_speculative_tokens": STEPS}),
        f"layer ids {shifted} (trained on {trained})": (
            with_config(export, tmp / "shifted", eagle_aux_hidden_state_layer_ids=shifted),
            {"method": "eagle3", "num_speculative_tokens": STEPS}),
        f"a layer id past the {n}-layer target": (
            with_config(export, tmp / "past", eagle_aux_hidden_state_layer_ids=[*trained[:-1], n + 3]),
            {"method": "eagle3", "num_speculative_tokens": STEPS}),
        "num_speculative_tokens 0": (export, {"method": "eagle3", "model": str(export), "num_speculative_tokens": 0}),
    }


def test_every_mistake_the_doctor_names_is_one_for_the_engine(demo: Path, logs: Path, tmp_path: Path) -> None:
    from curator.doctor import diagnose

    prompts = heldout_prompt_ids(demo)
    correct = toolkit_acceptance(demo, demo / "export")["acceptance_length"]
    results, launches = {}, []
    for name, (draft, config) in cases(demo, tmp_path).items():
        config = {**config, "model": str(draft)}
        args = ["--speculative-config", json.dumps(config)]
        launch = shlex.join(["python", "-m", "vllm.entrypoints.openai.api_server", "--model", str(demo / "target"), *args])
        report = diagnose(draft, demo / "target", demo / "states", launch)
        results[name] = {"doctor": [f"{c.name}: {c.detail}" for c in report.errors]}
        launches.append((name, VllmServer(demo / "target", logs, args, max_num_seqs=2)))
    # two launches at a time (a start is mostly one core importing vLLM): a refusal beside a full start
    launches.sort(key=lambda c: c[0] not in REFUSED_AT_START)
    pairs = [(launches[i], launches[-1 - i]) for i in range((len(launches) + 1) // 2)]
    for pair in pairs:
        pair = tuple(dict.fromkeys(pair))  # the middle one of an odd count alone
        try:
            for _, server in pair:
                server.start()
            for name, server in pair:
                results[name].update(outcome(server, prompts))
                print(f"\n{name}: {json.dumps(results[name], indent=1)}")
        finally:
            for _, server in pair:
                server.stop()
    print(f"\ncorrect launch: curator eval's acceptance {correct}")
    (logs / "doctor-vs-engine.json").write_text(json.dumps({"correct": correct, "cases": results}, indent=1))
    for name, r in results.items():
        assert r["doctor"], f"{name}: the doctor passed a launch the engine {r['engine']}"
        if r["engine"] == "serves":  # served, but not as trained: below the correct launch (greedy, so exact)
            assert r["acceptance_length"] < correct - 0.01, (name, r, correct)
