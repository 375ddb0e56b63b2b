"""SIGTERM stops a stage within seconds (issue 49 item 3), also while its main thread is inside one
long call into C, where Python cannot run the handler that raises KeyboardInterrupt (hidden-states
over a 200,000-token sample ignored SIGTERM for minutes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# sum() over a range runs in C for hours without returning to the interpreter or letting go of the GIL: the
# Python-level handler cannot run until it ends, nor can any Python thread (the worst case of a long call).
STUCK = """
import re, sys
from curator.signals import sigterm_as_ctrl_c
with sigterm_as_ctrl_c(grace_s={grace}):
    print("ready", flush=True)
    {body}
"""


def run_and_terminate(body: str, grace: float = 1.0) -> tuple[int, float, str]:
    proc = subprocess.Popen([sys.executable, "-c", STUCK.format(grace=grace, body=body)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(0.3)  # inside the long call
        start = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
        return proc.returncode, time.monotonic() - start, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sigterm_ends_a_main_thread_stuck_in_one_long_c_call() -> None:
    code, took, err = run_and_terminate("sum(range(10 ** 12))")
    assert code == -signal.SIGKILL and took < 10, (code, took, err)
    assert "still running 1 s after SIGTERM; killed" in err


def test_a_responsive_block_still_gets_keyboard_interrupt_and_runs_its_finally() -> None:
    body = "try:\n        import time; time.sleep(60)\n    finally:\n        print('flushed', file=sys.stderr)"
    code, took, err = run_and_terminate(body, grace=30.0)
    # KeyboardInterrupt propagates out of `-c`: Python's own exit status for it, after the finally ran
    assert "flushed" in err and "KeyboardInterrupt" in err and took < 5
    assert "still running" not in err and code != 0


# The transformers backend generates on a worker thread; asyncio.run waits for that thread after the
# run is cancelled. A generate call of minutes (sleeping here, as a forward pass releases the GIL) held
# a SIGTERM-ed `generate` until it returned.
STUCK_GENERATE = """
import sys, time
import curator.signals
curator.signals.GRACE_S = 1.0
from curator.generate import GenerateConfig, generate
from curator.generate.local import TransformersBackend

def stuck(self, conversations):
    print("ready", flush=True)
    time.sleep(600)

TransformersBackend._generate = stuck
generate(GenerateConfig.model_validate_json(sys.argv[1]))
"""


def test_sigterm_ends_a_generate_whose_model_call_does_not_return(tmp_path: Path, tiny_target: Path) -> None:
    import json

    from curator.generate import GenerateConfig
    from tests.fakes.openai_server import write_mix

    mix = write_mix(tmp_path / "mix", [{"id": "a", "turns": "all", "messages": [{"role": "user", "content": "hi"}]}])
    cfg = GenerateConfig(mix=mix, out=tmp_path / "out", model=str(tiny_target), backend="transformers", max_tokens=2)
    proc = subprocess.Popen([sys.executable, "-c", STUCK_GENERATE, cfg.model_dump_json()], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        start = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL and took < 15, (proc.returncode, took, err)
    assert "still running 1 s after SIGTERM; killed" in err
    # the cancelled run's own finally ran within the grace: the status says it was interrupted
    assert json.loads((tmp_path / "out" / "generation.json").read_text())["status"] == "interrupted"
