"""A JSON file read with every way it can fail named: the one reader of the config files a user hands in.

`json.loads` fails in more ways than JSONDecodeError: an integer of more digits than Python converts
(4,300 by default) is a plain ValueError, nesting deeper than the interpreter's recursion limit a
RecursionError, and bytes that are not UTF-8 a UnicodeDecodeError. A config.json is a file from
anywhere (an export copied from another machine, a target from the Hub), so each of these is a
one-line refusal, never "unexpected ... please report it".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from training.errors import ConfigFileError


class JSONFileError(ConfigFileError):
    """A JSON file exists but cannot be read as JSON (the reason says why)."""


def parse_json(text: str | bytes) -> Any:
    """Return the JSON value of `text`; ValueError (with the reason in words) for anything that is not JSON."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested deeper than Python's JSON parser goes") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, the integer digit limit
        raise ValueError(str(exc).split("; use sys.set_int_max_str_digits")[0]) from None


def read_json(path: str | Path) -> Any:
    """Return the JSON value in the file `path`.

    FileNotFoundError passes as it is (callers say what was expected there); any other failure to
    read or parse the file is a JSONFileError naming the file and the reason.
    """
    file = Path(path)
    try:
        raw = file.read_bytes()
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise JSONFileError(f"{file} is unreadable ({exc.strerror or exc})") from None
    try:
        return parse_json(raw)
    except ValueError as exc:
        raise JSONFileError(f"{file} is not valid JSON ({exc})") from None
