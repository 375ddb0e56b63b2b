"""Is the Hub reachable? One quick probe before a build reads any Hub source.

Without it, a machine with no network spends half a minute in the datasets library's retries
and then fails on the first source; the probe fails in seconds and names every source that
needs the Hub.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from curator.errors import HubError
from curator.hub import PROBE_TIMEOUT_S, unreachable

DEFAULT_ENDPOINT = "https://huggingface.co"
OFFLINE_ENV = "HF_HUB_OFFLINE"


def offline() -> bool:
    """Return whether the Hub libraries are told to stay offline (they then read their local cache)."""
    return os.environ.get(OFFLINE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def require_hub(datasets: Sequence[str], endpoint: str | None = None, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Raise HubError, listing every dataset in `datasets`, when the Hub cannot be reached.

    Nothing is probed when offline mode is on or no dataset needs the Hub (the datasets library
    also loads a local folder given as a dataset id).
    """
    datasets = [d for d in datasets if not Path(d).exists()]
    if not datasets or offline():
        return
    url = (endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
    why = unreachable(url, timeout_s)
    if why is not None:
        names = ", ".join(dict.fromkeys(datasets))
        raise HubError(
            f"cannot reach the Hub at {url} ({why}), so {len(set(datasets))} source(s) cannot be "
            f"read: {names}. To read them from the local datasets cache, run with --offline "
            f"({OFFLINE_ENV}=1); or point those sources at local files (path: ...)"
        )
