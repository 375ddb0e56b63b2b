"""The one reader of the config files a user hands in: recipes, run configs, traffic profiles, the
scouts' briefs. Every way such a file can fail is one ConfigFileError naming the file and why, in
the same words whichever stage reads it.

YAML is read without aliases (safe_yaml.py) and JSON with every failure of `json.loads` named
(jsonfile.py). PyYAML is optional on the model side: a GPU node may lack it, and JSON always works.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from training.errors import ConfigFileError
from training.io.jsonfile import parse_json

Syntax = Literal["json", "yaml"]
_FILE_KIND = {"json": "a JSON file", "yaml": "a YAML file", None: "a JSON or YAML file"}


def syntax_of(path: Path) -> Syntax:
    """Return the syntax a config file's suffix says: YAML for .yaml and .yml, else JSON."""
    return "yaml" if path.suffix in (".yaml", ".yml") else "json"


def read_text(path: str | Path, what: str = "config", kind: str | None = None) -> str:
    """Return the text of the `what` file `path` (`kind`: what such a file is, for the message)."""
    file = Path(path)
    try:
        return file.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigFileError(f"cannot read {what} {file}: {exc.strerror or exc}", "missing") from None
    except OSError as exc:
        raise ConfigFileError(f"cannot read {what} {file}: {exc.strerror or exc}", "unreadable") from None
    except UnicodeDecodeError:
        raise ConfigFileError(f"{file} is not text (not UTF-8): a {what} is {kind or _FILE_KIND[None]}",
                              "not text") from None


def parse_config(text: str, where: str, syntax: Syntax) -> Any:
    """Return the plain data of a config's `text` in `syntax`; `where` names it in the message."""
    if syntax == "json":
        try:
            return parse_json(text)
        except ValueError as exc:
            raise ConfigFileError(f"{where} is not valid JSON ({exc})") from None
    try:
        import yaml  # optional on the model side

        from training.io.safe_yaml import error_text, safe_load
    except ImportError:
        raise ConfigFileError(f"{where} is YAML but PyYAML is not installed; install it or convert to JSON",
                              "unreadable") from None
    try:
        return safe_load(text)  # no aliases: a 460-byte "billion laughs" file is refused, not expanded
    except yaml.YAMLError as exc:
        raise ConfigFileError(f"{where}: {error_text(exc)}") from None


def read_config(path: str | Path, what: str = "config", syntax: Syntax | None = None) -> Any:
    """Return the plain data in the `what` file `path`, read as `syntax` (None: as its suffix says)."""
    file = Path(path)
    text = read_text(file, what, _FILE_KIND[syntax])
    return parse_config(text, str(file), syntax or syntax_of(file))
