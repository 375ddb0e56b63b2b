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


def cached(dataset: str) -> bool:
    """Return whether the datasets library can load `dataset` offline: its files are in the Hub
    cache (HF_HUB_CACHE/datasets--ORG--NAME) or a prepared copy is in the datasets cache
    (HF_DATASETS_CACHE/ORG___NAME/CONFIG/VERSION/HASH), the two places it looks."""
    from huggingface_hub import constants

    if (Path(constants.HF_HUB_CACHE) / f"datasets--{dataset.replace('/', '--')}" / "snapshots").is_dir():
        return True
    from datasets.naming import camelcase_to_snakecase  # how the datasets library names its cache folders

    parts = dataset.split("/")
    parts[-1] = camelcase_to_snakecase(parts[-1])
    prepared = Path(os.environ.get("HF_DATASETS_CACHE") or Path(constants.HF_HOME) / "datasets") / "___".join(parts)
    return any(p.is_dir() for p in prepared.glob("*/*/*"))


def require_hub(datasets: Sequence[str], endpoint: str | None = None, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Raise HubError, listing every dataset in `datasets`, when the Hub cannot be reached, or, in
    offline mode, when any of them is not in the local cache.

    Nothing is probed when no dataset needs the Hub (the datasets library also loads a local
    folder given as a dataset id).
    """
    datasets = list(dict.fromkeys(d for d in datasets if not Path(d).exists()))
    if not datasets:
        return
    if offline():
        missing = [d for d in datasets if not cached(d)]
        if missing:
            raise HubError(
                f"offline ({OFFLINE_ENV}=1), and {len(missing)} source(s) are not in the local datasets cache: "
                f"{', '.join(missing)}. Load them once with the network (a build-mix without --offline "
                "caches them), or point those sources at local files (path: ...)"
            )
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
