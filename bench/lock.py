"""The locked environment (constraints.txt): which installed packages differ from it.

Figures stated to the digit (the README's demo paragraph, bench/results/demo-figures.json) were
made under the lock; the suite holds a run to those digits only where the environment is the
lock, and to what the demo must achieve everywhere else. CI checks that it runs the lock:

    python -m bench.lock            # exit 1 and the differences, unless this is the lock
"""

from __future__ import annotations

import sys
from functools import cache
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

LOCK = Path(__file__).resolve().parents[1] / "constraints.txt"
# the venv's own installers and the project itself are not part of what the lock pins
NOT_LOCKED = frozenset({"pip", "setuptools", "wheel", "eagle-curator"})


def locked(path: Path = LOCK) -> dict[str, str]:
    """Return {package: version} of a lock file of `name==version` lines."""
    pins: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            (spec,) = req.specifier
            pins[canonicalize_name(req.name)] = spec.version
    return pins


def installed() -> dict[str, str]:
    """Return {package: version} of this environment; a local label (+cpu) names the build, not
    the release the lock pins, so it is left out."""
    found = {canonicalize_name(d.metadata["Name"]): d.version.split("+", 1)[0] for d in metadata.distributions()}
    return {name: version for name, version in found.items() if name not in NOT_LOCKED}


def differences(path: Path = LOCK) -> list[str]:
    """Return one line per package whose installed version is not the locked one, or that is
    installed and not locked; empty when this environment is the lock."""
    want, have = locked(path), installed()
    lines = [f"{name}: locked {pin}, installed {have.get(name) or 'nothing'}"
             for name, pin in sorted(want.items()) if have.get(name) != pin]
    lines += [f"{name}: installed {have[name]}, not in the lock" for name in sorted(set(have) - set(want))]
    return lines


@cache
def under_lock() -> bool:
    """Whether this environment is exactly the lock."""
    return not differences()


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else LOCK
    wrong = differences(path)
    for line in wrong:
        print(line, file=sys.stderr)
    if wrong:
        print(f"this environment is not {path.name}: install it with -c {path.name}, or after a dependency "
              "change run `bash .ci/lock.sh` and the demo figures again", file=sys.stderr)
        return 1
    print(f"this environment is {path.name} ({len(locked(path))} packages)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
