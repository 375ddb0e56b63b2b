"""A server launch command as the doctor reads it: options, the speculative settings, one check line.

Each engine module (curator/engines/sglang.py, vllm.py) reads its own flags into a LaunchSpec; what
is shared is here: the Check record the doctor prints, option splitting the way argparse does, and
the comparison of a path in a command with a folder on disk.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Status = Literal["ok", "warn", "error"]


@dataclass
class Check:
    """One line of the doctor's table: what was checked, ok/warn/error, and why."""

    name: str
    status: Status
    detail: str


def int_or_none(value: Any) -> int | None:
    """Return `value` as an int when it is a JSON number (not a bool), else None."""
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass
class LaunchSpec:
    """The speculative-decoding settings read from a server launch command."""

    engine: str  # a curator.engines name
    argv: list[str]
    target: str | None = None
    algorithm: str | None = None
    draft_path: str | None = None
    steps: int | None = None
    topk: int | None = None
    num_draft_tokens: int | None = None
    short_flags: bool = False  # vLLM's --spec-method/--spec-model/--spec-tokens were used
    serves_export: bool = False  # `vllm serve EXPORT`: vLLM builds the speculative config from the export
    export_steps: int | None = None  # then: the export's own speculative_tokens
    user_config: dict[str, Any] = field(default_factory=dict)  # vLLM: --speculative-config as written
    problems: list[Check] = field(default_factory=list)


def options(argv: list[str]) -> tuple[list[tuple[str, str, str | None]], list[str]]:
    """Return the options in order as (as written, normalised, value or None) and the positionals.

    Names are normalised to dashes (vLLM accepts underscores too); `-x` short options count as
    options, except python's own `-m`, whose module name is a positional.
    """
    opts: list[tuple[str, str, str | None]] = []
    positionals: list[str] = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        is_option = tok.startswith("--") or (tok.startswith("-") and tok[1:2].isalpha() and tok != "-m")
        if not is_option:
            positionals.append(tok)
            i += 1
            continue
        written, eq, value = tok.partition("=")
        norm = written[:2] + written[2:].replace("_", "-") if written.startswith("--") else written
        if eq:
            opts.append((written, norm, value))
        elif i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            opts.append((written, norm, argv[i + 1]))
            i += 1
        else:
            opts.append((written, norm, None))
        i += 1
    return opts, positionals


def option_map(argv: list[str]) -> tuple[dict[str, str | None], list[str]]:
    """Return {normalised flag: value} (the last one wins, as in argparse) and the positionals."""
    opts, positionals = options(argv)
    return {norm: value for _, norm, value in opts}, positionals


def int_opt(spec: LaunchSpec, flag: str, value: str | None) -> int | None:
    """Return the flag's value as an int; a non-integer is a problem noted on `spec`."""
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        spec.problems.append(Check(flag, "error", f"{flag} {value!r} is not an integer"))
        return None


# --api-key, --admin-api-key, --hf-token, --password...: a value the doctor never echoes
_SECRET_FLAG = re.compile(r"(?:key|token|password|secret)$")
SECRET_PLACEHOLDER = "[REDACTED]"


def is_secret_flag(norm: str) -> bool:
    """Return whether a normalised option carries a credential (`--api-key`, not `--ssl-keyfile`)."""
    return norm.startswith("--") and _SECRET_FLAG.search(norm) is not None


def kept_args(spec: LaunchSpec, dropped: set[str]) -> list[str]:
    """Return the user's own options (everything but the ones we rewrite), as written, in order;
    a credential's value (`--api-key sk-...`) is replaced by a placeholder for the user to fill in."""
    opts, _ = options(spec.argv)
    kept: list[str] = []
    for written, norm, value in opts:
        if norm in dropped:
            continue
        kept.append(written)
        if value is not None:
            kept.append(SECRET_PLACEHOLDER if is_secret_flag(norm) else value)
    return kept


def same_path(given: str, expected: str | Path) -> Status:
    """Return ok when both name the same directory, warn when only the last part matches."""
    try:
        if Path(given).exists() and os.path.samefile(given, expected):
            return "ok"
    except OSError:
        pass
    if os.path.normpath(given) == os.path.normpath(str(expected)):
        return "ok"
    if Path(given.rstrip("/")).name == Path(str(expected).rstrip("/")).name:
        return "warn"
    return "error"
