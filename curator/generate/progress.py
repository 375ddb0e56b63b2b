"""The generate stage's live progress line, shared by `curator generate` and the demo."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.progress import Progress, TaskID

if TYPE_CHECKING:
    from curator.generate import Snapshot


class LiveProgress:
    """One bar: conversations done/total, rate and ETA, plus req/s, tok/s, errors and the
    requests in flight on each endpoint."""

    def __init__(self, bar: Progress) -> None:
        self.bar = bar
        self.task: TaskID | None = None

    def __call__(self, snap: Snapshot) -> None:
        if self.task is None:
            self.task = self.bar.add_task("generate", total=snap.total, info="")
        flights = " ".join(f"{short_endpoint(name)}:{n}" for name, n in snap.in_flight.items())
        info = (f"{snap.requests_per_s:,.1f} req/s  {snap.output_tokens_per_s:,.0f} tok/s  "
                f"errors {snap.errors:,}  in flight {flights}")
        self.bar.update(self.task, completed=snap.done, total=snap.total, info=info)


def short_endpoint(endpoint: str) -> str:
    """Return an endpoint without its scheme, as the progress line shows it."""
    return endpoint.split("://", 1)[-1]
