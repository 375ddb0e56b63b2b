"""Time `scrub()` on a 20 KB request of mixed prose, code, JSON and personal data (curator tap scrubs
every recorded request, so the scrubber must stay fast). Not a test: a measurement.

    python -m tests.curator.traffic.scrub_timing                    # the scrubber in this tree
    git show REV:curator/traffic/scrub.py > /tmp/scrub_rev.py
    python -m tests.curator.traffic.scrub_timing /tmp/scrub_rev.py ""  # that version, then this tree's

Prints the best of 5 rounds of 50 calls (per call, in ms), so that a busy machine shows less noise.
"""

from __future__ import annotations

import importlib.util
import random
import sys
import timeit
from collections.abc import Callable

PIECES = (
    "Can you help me refactor this function so that it handles the edge cases better? ",
    "def parse(line: str) -> dict:\n    key, _, value = line.partition('=')\n    return {key.strip(): value.strip()}\n",
    '{"id": 1234, "name": "widget", "price": 19.99, "tags": ["a", "b"], "updated": "2023-10-05T12:30:45Z"}\n',
    "The meeting is on 2024-03-15 at 14:30; we expect 1,250 users and a p99 of 320 ms. ",
    "Solve for x: 3x^2 + 2x - 8 = 0, then compute the sum of the roots. ",
    'Traceback (most recent call last):\n  File "/home/app/main.py", line 42, in <module>\n    run()\nValueError: bad input\n',
    "Write a short poem about the sea and the wind, in the style of a sonnet, with fourteen lines. ",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; } std::vector<int> v{1, 2, 3};\n",
    "Please translate: « Où est la gare ? » into German and Spanish. Überall ist es schön. ",
    "Contact jane.roe@example.com or call +44 20 7946 0958; my IBAN is DE89 3704 0044 0532 0130 00. ",
    "I live at 42 Baker Street, London NW1 6XE, and my password is hunter22. ",
    "SELECT id, count(*) FROM orders WHERE created_at > '2024-01-01' GROUP BY id ORDER BY 2 DESC LIMIT 10;\n",
)


def request_text(size: int = 20_000, seed: int = 0) -> str:
    """Return `size` characters of the pieces above in a seeded random order."""
    rng = random.Random(seed)
    text = ""
    while len(text) < size:
        text += rng.choice(PIECES)
    return text[:size]


def load_scrub(path: str | None) -> Callable[[str], str]:
    """Return scrub() of the module at `path`, or of curator.traffic.scrub (None or "")."""
    if not path:
        from curator.traffic.scrub import scrub

        return scrub
    spec = importlib.util.spec_from_file_location("scrub_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    loaded: Callable[[str], str] = module.scrub
    return loaded


def main(paths: list[str]) -> None:
    text = request_text()
    for path in paths or [""]:  # no path: the tree's own
        scrub = load_scrub(path)
        best = min(timeit.repeat(lambda: scrub(text), number=50, repeat=5)) / 50
        print(f"{path or 'curator.traffic.scrub'}: {len(text):,} chars, scrub() {best * 1000:.2f} ms")


if __name__ == "__main__":
    main(sys.argv[1:])
