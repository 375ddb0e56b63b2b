"""The Prometheus text exposition (what `/metrics` pages are), read into samples."""

from __future__ import annotations

import re

# name{labels} value [timestamp]
_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)(?:\s+\S+)?$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Return (name, labels, value) of every sample in a Prometheus text exposition."""
    samples = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue  # a line of another exposition format: not ours to judge
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        labels = dict(_LABEL.findall(m.group(2) or ""))
        samples.append((m.group(1), labels, value))
    return samples


def is_counter(name: str, sample_name: str) -> bool:
    """Return whether a sample is counter `name` (prometheus_client adds `_total`; `_created` is not it)."""
    return sample_name in (name, name + "_total")
