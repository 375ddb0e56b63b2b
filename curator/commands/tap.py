"""`curator tap`: serve as a proxy in front of SGLang or vLLM and record a scrubbed sample of the
requests it serves and the target's own answers into size-rotated JSONL files (docs/tap.md)."""

from __future__ import annotations

import asyncio
import signal
import threading
from pathlib import Path
from typing import Optional

import typer

from curator.errors import ConfigError
from curator.ui import console, summary_table

MB = 1024 * 1024


def _caps(values: list[str]) -> dict[str, int]:
    from curator.traffic.schema import CATEGORIES

    caps: dict[str, int] = {}
    for value in values:
        name, _, n = value.partition("=")
        if name not in CATEGORIES or not n.isdigit():
            raise ConfigError(f"--cap {value!r}: expected CATEGORY=N with CATEGORY one of {', '.join(CATEGORIES)}")
        caps[name] = int(n)
    return caps


def tap_command(
    engine: str = typer.Option(..., "--engine", help="The engine's address (SGLang or vLLM), e.g. http://127.0.0.1:30000; every request is forwarded there unchanged."),
    out: Path = typer.Option(..., "--out", help="Folder of the tap's log (tap-*.jsonl, rotated by size); `curator profile --traffic` reads it."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: every interface)."),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="Port to listen on: point the clients here instead of at the engine."),
    rate: float = typer.Option(1.0, "--rate", min=0.0, max=1.0, help="Share of chat and completions requests recorded (0.05: one in twenty)."),
    cap: list[str] = typer.Option([], "--cap", help="CATEGORY=N: record at most N requests of that traffic category this run (agentic, code, reasoning, chat); repeatable."),
    max_file_mb: float = typer.Option(64.0, "--max-file-mb", min=0.001, help="A new file once the current one would pass this size."),
    max_total_mb: float = typer.Option(1024.0, "--max-total-mb", min=0.001, help="The oldest files are removed while the log passes this size."),
    queue_size: int = typer.Option(1024, "--queue", min=1, help="Records waiting for the writer at most; past it a record is dropped (counted), never the request."),
    scrub_processes: int = typer.Option(1, "--scrub-processes", min=1, help="Processes scrubbing records (about 50 records/s of 20 KB each); more where records are dropped for a full queue and cores are free."),
    stats_every: float = typer.Option(60.0, "--stats-every", min=0.0, help="Seconds between console lines of the tap's counters (0: none)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed of the sampling (default: random)."),
) -> None:
    """Serve as a proxy in front of the engine and record a scrubbed sample of its requests and the target's own answers."""
    from curator.http import base_url, public_url
    from curator.tap.proxy import TapProxy
    from curator.tap.writer import LOCK_NAME, TapLog, TapWriter
    from curator.traffic.scrub import scrub
    from training.io.outlock import OutputLock

    try:
        root = base_url(engine)
    except ValueError as exc:
        raise ConfigError(f"--engine: {exc}") from None
    caps = _caps(cap)
    if max_total_mb < max_file_mb:
        raise ConfigError("--max-total-mb must be at least --max-file-mb")
    lock = OutputLock(out, LOCK_NAME, "curator tap").acquire()
    log = TapLog(out, max_file_bytes=int(max_file_mb * MB), max_total_bytes=int(max_total_mb * MB))
    writer = TapWriter(log, scrub=scrub, caps=caps, queue_size=queue_size, processes=scrub_processes).start()

    def listening(h: str, p: int) -> None:
        console.print(f"tap: http://{h}:{p} -> {public_url(root)}, recording {rate:g} of chat/completions requests into {out}"
                      f" (counters: GET /tap/stats)")

    proxy = TapProxy(root, writer, rate=rate, seed=seed, on_listen=listening)
    stop = threading.Event()

    def report() -> None:
        while not stop.wait(stats_every):
            s = proxy.stats()
            console.print(f"tap: {s['requests']} requests, {s.get('recorded', 0)} recorded, {s.get('dropped_queue_full', 0)} dropped (queue full), "
                          f"{s.get('dropped_write_error', 0)} dropped (write errors), {s.get('dropped_scrub_timeout', 0)} dropped (scrub too slow), "
                          f"{s.get('incomplete', 0)} incomplete")

    if stats_every > 0:
        threading.Thread(target=report, daemon=True).start()

    def terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # a service manager's stop: the queued records are written, as on Ctrl-C

    signal.signal(signal.SIGTERM, terminate)
    try:
        asyncio.run(proxy.serve(host, port))
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        writer.close()
        lock.release()
        s = proxy.stats()
        console.print(summary_table("tap", [(k, v) for k, v in s.items() if k not in ("per_category", "file")]))


def register(app: typer.Typer) -> None:
    """Add `tap` to the CLI."""
    app.command("tap")(tap_command)
