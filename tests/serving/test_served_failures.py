"""A real vLLM that dies under `curator generate`, or is restarted under it: the same named errors and
resume as against the stand-in servers (tests/curator/generate/).

One server is SIGKILLed (its whole process group: API server and engine core) while two generate
runs talk to it. The run with few attempts ends `partial`, each failed row recorded in
errors.jsonl as a transient failure naming the endpoint, and resumes against a new server with
every id exactly once. The run with enough attempts rides out the restart of the server on the
same port and finishes `complete`, with every id exactly once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from test_served_generate import records, write_mix
from vllm_process import VllmServer, start_or_fail

SCRIPT = ("import sys; from curator.generate import GenerateConfig, generate; "
          "generate(GenerateConfig.model_validate_json(sys.argv[1]))")


def generate_argv(mix: Path, out: Path, demo: Path, url: str, attempts: int) -> list[str]:
    config = {"mix": str(mix), "out": str(out), "model": "target", "endpoints": [url], "engine": "vllm",
              "tokenizer": str(demo / "target"), "temperature": 0.0, "max_tokens": 48, "concurrency": 2,
              "shard_rows": 2, "max_attempts": attempts, "retry_base_s": 0.5}
    return [sys.executable, "-c", SCRIPT, json.dumps(config)]


def meta(out: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / "generation.json").read_text())
    return data


def test_a_killed_and_restarted_engine_loses_no_row_and_repeats_none(demo: Path, logs: Path, tmp_path: Path) -> None:
    from curator.rows.schema import open_mix

    mix = write_mix(tmp_path / "mix", rows=12)
    ids = sorted(r.id for r in open_mix(mix).rows())
    first = start_or_fail(VllmServer(demo / "target", logs, max_num_seqs=4))
    port, procs = first.port, []
    few, many = tmp_path / "few-attempts", tmp_path / "many-attempts"
    try:
        # two attempts: gives up at once; 14: half-minute pauses outlast a restart (about a minute here)
        for out, attempts in ((few, 2), (many, 14)):
            procs.append(subprocess.Popen(generate_argv(mix, out, demo, first.url, attempts), stdout=subprocess.DEVNULL,
                                          stderr=subprocess.PIPE, start_new_session=True))
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not all(list(o.glob("shard-*.jsonl")) for o in (few, many)):
            assert all(p.poll() is None for p in procs), "a run ended before the engine was killed"
            time.sleep(0.2)
        os.killpg(first.proc.pid, signal.SIGKILL)  # the engine dies mid-run: API server and engine core
        first.stop()
        assert procs[0].wait(timeout=300) == 0, procs[0].stderr.read().decode()[-3000:]  # type: ignore[union-attr]
        # restarted on the same port while the patient run still retries
        second = start_or_fail(VllmServer(demo / "target", logs, max_num_seqs=4, port=port))
        try:
            assert procs[1].wait(timeout=900) == 0, procs[1].stderr.read().decode()[-3000:]  # type: ignore[union-attr]
            # the run that gave up: partial, each failed row a transient failure naming the endpoint
            done = [r["id"] for r in records(few)]
            assert meta(few)["status"] == "partial" and 0 < len(done) < len(ids)  # every row handled, some failed
            failed = [json.loads(line) for line in (few / "errors.jsonl").read_text().splitlines() if line.strip()]
            assert failed and all(not f["permanent"] and f["endpoint"].startswith(first.url)
                                  and f["error"].startswith("connection failed") for f in failed), failed[:3]
            assert not set(done) & {f["id"] for f in failed}
            # ... resumed against the engine that came back: every id once, nothing sent twice
            rerun = subprocess.run(generate_argv(mix, few, demo, second.url, 2), capture_output=True, text=True,
                                   timeout=900)
            assert rerun.returncode == 0, rerun.stderr[-3000:]
            for out in (few, many):
                got = [r["id"] for r in records(out)]
                assert sorted(got) == ids, out.name  # every id exactly once
                assert meta(out)["status"] == "complete" and all(r["mode"] == "token" for r in records(out))
            assert meta(many)["stats"]["retries"] > 0  # it did ride out the restart
        finally:
            second.stop()
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        first.stop()


def engine_core_pid(server: VllmServer) -> int:
    """Return the pid of the server's engine core: the API server's child that vLLM names VLLM::EngineCore."""
    assert server.proc is not None
    for task in Path(f"/proc/{server.proc.pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            if "EngineCore" in Path(f"/proc/{child}/cmdline").read_bytes().decode(errors="replace"):
                return int(child)
    raise AssertionError(f"no engine core process under the API server {server.proc.pid}")


def test_an_engine_that_died_under_a_live_api_server_answers_500_and_the_run_resumes(
        demo: Path, logs: Path, tmp_path: Path, target_server: VllmServer) -> None:
    """vLLM's engine core dies while its API server stays up (VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1, as
    behind a load balancer that keeps the port): every request, in flight or new, is answered HTTP 500
    (`EngineDeadError`). The run records each row it could not finish as a transient failure naming the
    500, ends `partial`, and resumes on a healthy engine with every id once."""
    from curator.rows.schema import open_mix

    mix = write_mix(tmp_path / "mix", rows=12)
    ids = sorted(r.id for r in open_mix(mix).rows())
    out = tmp_path / "gen"
    dying = start_or_fail(VllmServer(demo / "target", logs, max_num_seqs=4,
                                     env={"VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "1"}))
    try:
        run = subprocess.Popen(generate_argv(mix, out, demo, dying.url, 2), stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, start_new_session=True)
        try:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and not list(out.glob("shard-*.jsonl")):
                assert run.poll() is None, "the run ended before the engine died"
                time.sleep(0.2)
            os.kill(engine_core_pid(dying), signal.SIGKILL)
            assert run.wait(timeout=300) == 0, run.stderr.read().decode()[-3000:]  # type: ignore[union-attr]
        finally:
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGKILL)
                run.wait()
        # the API server is still up and says what happened, as an HTTP 500
        answer = httpx.post(f"{dying.url}/v1/completions", json={"model": "target", "prompt": "a", "max_tokens": 1},
                            timeout=60)
        assert answer.status_code == 500 and "EngineCore" in answer.text, (answer.status_code, answer.text[:300])
        failed = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines() if line.strip()]
        done = [r["id"] for r in records(out)]
        assert meta(out)["status"] == "partial" and failed and 0 < len(done) < len(ids)
        assert all(not f["permanent"] and f["error"].startswith("HTTP 500") and "EngineCore" in f["error"]
                   and f["endpoint"].startswith(dying.url) for f in failed), failed[:3]
    finally:
        dying.stop()
    # resumed on a healthy engine (the session's target server: the same model)
    rerun = subprocess.run(generate_argv(mix, out, demo, target_server.url, 2), capture_output=True, text=True,
                           timeout=900)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert sorted(r["id"] for r in records(out)) == ids  # every id exactly once
    assert meta(out)["status"] == "complete"
