"""ToolTalk conversations (pip `nvidia-tooltalk`, MIT), with the tool schemas read from its Python API
classes without running them.

ToolTalk stores its conversations as JSON (tooltalk/data/tooltalk/*.json) and its tools as Python
classes (tooltalk/apis/*.py): each API class has a literal `description` and `parameters` ({name:
{type, description, required}}), each suite class a `name` and a list of its API classes. The files
are parsed with `ast` (literals only, nothing imported or executed) and each API becomes an OpenAI
tool schema; an API whose parameters are not plain JSON schema literals is named with the reason
instead, and the conversations that offer it are counted malformed. A conversation file read in the
package's own layout gets its schemas as `tools` (`with_tools`, the format's hook on local files).
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from curator.rows.formats import fields
from curator.rows.formats.conversation import Conversation, MalformedRow, Turn
from curator.rows.formats.table import RowFormat, register
from curator.rows.formats.tools import pair_tool_turns, tool_call, tool_schema

# JSON schema's types: an API that declares another (a Python type name) does not convert cleanly.
_JSON_TYPES = frozenset({"string", "number", "integer", "boolean", "array", "object", "null"})
_MAX_API_FILE = 1 << 20  # ToolTalk's largest API file is ~20 KB; anything far past that is not one


@dataclass
class ToolTalkAPIs:
    """The tool schemas of one ToolTalk package: per API its schema or why it does not convert, per suite its APIs."""

    schemas: dict[str, dict[str, Any]] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)
    suites: dict[str, list[str]] = field(default_factory=dict)

    def tools_for(self, row: dict[str, Any]) -> dict[str, Any]:
        """Return `row` with `tools` (the APIs of its `suites_used`, as ToolTalk offers them), or with
        `tools_error` naming the suite or API that does not convert."""
        suites = row.get("suites_used")
        if not isinstance(suites, list) or not all(isinstance(s, str) for s in suites):
            return {**row, "tools_error": "field 'suites_used' is not a list of suite names"}
        names: list[str] = []
        for suite in suites:
            if suite not in self.suites:
                return {**row, "tools_error": f"ToolTalk suite {suite[:40]!r} is not among the package's API classes"}
            names.extend(n for n in self.suites[suite] if n not in names)
        for name in names:
            if name in self.problems:
                return {**row, "tools_error": f"ToolTalk API {name!r} does not convert to JSON schema: "
                                              f"{self.problems[name]}"}
        return {**row, "tools": [self.schemas[n] for n in names]}


def apis_folder(data_file: Path) -> Path | None:
    """Return the package's tooltalk/apis folder for a conversation file in its own layout
    (tooltalk/data/<set>/<name>.json), or None."""
    parents = data_file.parents
    if len(parents) < 3:
        return None
    folder = parents[2] / "apis"
    return folder if (folder / "api.py").is_file() else None


@lru_cache(maxsize=4)
def load_apis(folder: Path) -> ToolTalkAPIs:
    """Return the schemas of every API class in the folder's .py files (parsed, never imported)."""
    out = ToolTalkAPIs()
    for path in sorted(folder.glob("*.py")):
        try:
            if path.stat().st_size > _MAX_API_FILE:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError, RecursionError):
            continue  # not one of ToolTalk's API files: its APIs are missing, and the suites naming them say so
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                _read_class(node, out)
    for suite, names in out.suites.items():
        for name in names:
            if name not in out.schemas and name not in out.problems:
                out.problems[name] = f"suite {suite!r} lists it, but no API class defines it"
    return out


def _class_attrs(node: ast.ClassDef) -> dict[str, ast.expr]:
    return {t.id: stmt.value for stmt in node.body if isinstance(stmt, ast.Assign)
            for t in stmt.targets if isinstance(t, ast.Name)}


def _read_class(node: ast.ClassDef, out: ToolTalkAPIs) -> None:
    attrs = _class_attrs(node)
    if "apis" in attrs and "name" in attrs:  # a suite: name = "...", apis = [APIClass, ...]
        name = _literal(attrs["name"])
        members = attrs["apis"]
        if isinstance(name, str) and isinstance(members, ast.List):
            out.suites[name] = [e.id for e in members.elts if isinstance(e, ast.Name)]
        return
    if "parameters" not in attrs:
        return
    params = _literal(attrs["parameters"])
    description = _literal(attrs["description"]) if "description" in attrs else ""
    problem = _problem(params, description)
    if problem is not None:
        out.problems[node.name] = problem
        return
    properties = {k: {a: v for a, v in spec.items() if a != "required"} for k, spec in params.items()}
    required = [k for k, spec in params.items() if spec.get("required") is True]
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    out.schemas[node.name] = {"type": "function",
                              "function": {"name": node.name, "description": description, "parameters": schema}}


_UNREADABLE = object()


def _literal(node: ast.expr) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        return _UNREADABLE


def _problem(params: Any, description: Any) -> str | None:
    """Return why an API's parameters are not a JSON schema's properties, or None."""
    if params is _UNREADABLE:
        return "its parameters are computed, not a literal"
    if not isinstance(description, str):
        return "its description is not a literal string"
    if not isinstance(params, dict):
        return "its parameters are not a mapping"
    for name, spec in params.items():
        if not isinstance(name, str) or not isinstance(spec, dict):
            return f"parameter {name!r} is not a name with a mapping"
        if spec.get("type") not in _JSON_TYPES:
            return f"parameter {name!r} has type {spec.get('type')!r}, not a JSON schema type"
        if not isinstance(spec.get("required", False), bool):
            return f"parameter {name!r} has a `required` that is not true or false"
    return None


# ToolTalk's executor passes the session token itself (it is in no API's parameters); its recorded
# calls carry it, so it is taken out of them to match the schemas offered.
_TOOLTALK_INJECTED = "session_token"


def tooltalk(row: Mapping[str, Any]) -> Conversation:
    """Return a ToolTalk conversation: user and assistant turns (`text`), an assistant turn's `apis` as
    its tool calls followed by their results (`{"response", "exception"}` as ToolTalk shows them), and
    the schemas of the APIs of `suites_used` as the tools offered (`tools`, added by the reader from
    the package's API classes; `tools_error` when they do not convert). The closing user turn, which
    ToolTalk never answers, is left out."""
    if isinstance(row.get("tools_error"), str):
        raise MalformedRow(row["tools_error"])
    if not isinstance(row.get("tools"), list):
        raise MalformedRow("ToolTalk conversation without its tool schemas (read it in the package's own "
                           "layout, with tooltalk/apis/ beside tooltalk/data/)")
    items = fields.required(row, "conversation")
    if not isinstance(items, list) or not items:
        raise MalformedRow("field 'conversation' is not a non-empty list")
    conv = Conversation(tools=[tool_schema(t) for t in row["tools"]])
    n_calls = 0
    for item in items:
        if not isinstance(item, Mapping):
            raise MalformedRow("a turn in 'conversation' is not an object")
        role, text = fields.role(item.get("role")), item.get("text")
        if not isinstance(text, str):
            raise MalformedRow("a turn in 'conversation' has no text")
        apis = item.get("apis") or []
        if role == "assistant" and apis:
            if not isinstance(apis, list) or not all(isinstance(a, Mapping) and isinstance(a.get("request"), Mapping)
                                                     for a in apis):
                raise MalformedRow("field 'apis' is not a list of {request, response, exception}")
            calls = []
            for api in apis:
                params = api["request"].get("parameters")
                if isinstance(params, Mapping):
                    params = {k: v for k, v in params.items() if k != _TOOLTALK_INJECTED}
                calls.append(tool_call(api["request"].get("api_name"), params, f"call_{n_calls}"))
                n_calls += 1
            conv.append(Turn("assistant", "", tool_calls=calls))
            for call, api in zip(calls, apis):
                result = json.dumps({"response": api.get("response"), "exception": api.get("exception")},
                                    ensure_ascii=False)
                conv.append(Turn("tool", result, tool_call_id=call["id"]))
        conv.append((role, text))
    if len(conv) > 1 and conv[-1][0] == "user":
        # ToolTalk ends each conversation on a user turn that is never answered ("Thanks, that's all"):
        # without it the turn answered (turns=last) is the assistant's after its last calls and results.
        conv.pop()
    return pair_tool_turns(conv)


def with_tools(path: Path, rows: Iterable[Any]) -> Iterator[Any]:
    """Return the rows of a local file, each ToolTalk conversation with the `tools` of its suites when the
    file lies in the package's own layout (the schemas are the package's API classes); other rows as they are."""
    apis = apis_folder(path) if path.name.endswith(".json") else None
    if apis is None:
        yield from rows
        return
    found = load_apis(apis)
    for row in rows:
        yield (found.tools_for(row) if isinstance(row, dict) and "apis_used" in row and "conversation" in row
               and "tools" not in row else row)


# Agentic trajectories: each observation depends on the actions before it, so only the final
# answer can be regenerated faithfully.
register(RowFormat("tooltalk", tooltalk, columns=(frozenset({"conversation", "apis_used", "suites_used"}),), rank=50,
                   turns="last", file_rows=with_tools))
