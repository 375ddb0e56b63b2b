"""The domains of the multi-domain reference: text found on the machine, and two made here.

    python     .py files of the interpreter's library folders (bench/reference's source)
    c          other languages' code: C/C++/CUDA headers and sources, JavaScript, shell
    config     configuration files: TOML, INI/CFG, YAML, .conf, small JSON
    prose      documentation: Markdown, reStructuredText, package METADATA, .txt
    tools      JSON tool-call traces of coding agents (made here from a seed)
    arithmetic step-by-step arithmetic word problems, worked correctly (made here from a seed)

Each domain's documents split three ways by a stable hash of their path (bench/reference's
split): the target's training text, the candidate pool the mixes are built from, and the
traffic the deployment serves (whose held-out part measures the drafts). The category each
domain is filed under in a recipe is the traffic profile's vocabulary (curator.traffic.schema).
"""

from __future__ import annotations

import json
import os
import random
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from bench.reference.sources import read_texts

if TYPE_CHECKING:  # bench.reference.target imports torch: build-mix's worker processes need none of it
    from bench.reference.target import SourceSplit

CATEGORY = {"python": "code", "c": "code", "config": "code", "prose": "chat", "tools": "agentic",
            "arithmetic": "reasoning"}
DOMAINS = tuple(CATEGORY)
SUFFIXES = {
    "c": (".h", ".hpp", ".cuh", ".c", ".cc", ".cpp", ".js", ".sh"),
    "config": (".toml", ".cfg", ".ini", ".yaml", ".yml", ".conf", ".json"),
    "prose": (".md", ".rst", ".txt", "METADATA"),
}


def _roots() -> list[Path]:
    paths = sysconfig.get_paths()
    found = {Path(paths[k]) for k in ("stdlib", "purelib", "platlib", "include")}
    return sorted(found | {Path("/usr/include"), Path("/etc"), Path("/usr/share/doc")})


def files_with(suffixes: tuple[str, ...], max_bytes: int, roots: list[Path] | None = None) -> list[tuple[str, str]]:
    """Return (path, text) of files whose name ends with one of `suffixes`, in sorted walk order, up
    to `max_bytes` of text (unreadable, non-UTF-8 and oversized files skipped). The walk stops once
    it has enough: a small budget reads a small part of the disk."""
    def walk() -> Iterator[Path]:
        for root in roots or _roots():
            for folder, dirs, names in os.walk(root):
                dirs.sort()
                yield from (Path(folder) / name for name in sorted(names) if name.endswith(suffixes))

    return read_texts(walk(), max_bytes, keep_blank=False)


TOOLS = {
    "read_file": {"path": "str"}, "write_file": {"path": "str", "content": "str"},
    "run_tests": {"path": "str", "verbose": "bool"}, "search_code": {"query": "str", "max_results": "int"},
    "list_dir": {"path": "str"}, "run_shell": {"command": "str", "timeout_s": "int"},
    "git_diff": {"ref": "str"}, "open_issue": {"title": "str", "labels": "list"},
}
_WORDS = ("auth", "cache", "client", "config", "parser", "server", "worker", "router", "store", "queue", "token",
          "session", "model", "schema", "index", "retry", "limits", "export", "loader", "metrics")
_TASKS = ("fix the failing test in", "add retries to", "find where we parse", "rename the helper in",
          "explain the error from", "speed up", "add type hints to", "remove the dead code in")


def tool_schemas() -> list[dict]:
    """Return the tools an agentic request offers, as OpenAI function schemas."""
    types = {"str": "string", "bool": "boolean", "int": "integer", "list": "array"}
    return [{"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "properties": {k: {"type": types[v]} for k, v in args.items()}, "required": list(args)}}}
        for name, args in TOOLS.items()]


def _arg(rng: random.Random, kind: str) -> object:
    w = rng.choice(_WORDS)
    return {"str": f"src/{w}/{rng.choice(_WORDS)}.py", "bool": rng.random() < 0.5, "int": rng.randint(1, 60),
            "list": [w, rng.choice(("bug", "perf", "docs"))]}[kind]


def tool_trace(rng: random.Random) -> str:
    """Return one agent episode as JSON lines: the task, then tool calls and their results."""
    w = rng.choice(_WORDS)
    lines = [json.dumps({"role": "user", "content": f"Please {rng.choice(_TASKS)} the {w} module."})]
    for step in range(rng.randint(3, 8)):
        name = rng.choice(list(TOOLS))
        args = {k: _arg(rng, v) for k, v in TOOLS[name].items()}
        call_id = f"call_{step}"
        lines.append(json.dumps({"role": "assistant", "tool_calls": [{"id": call_id, "name": name, "arguments": args}]}))
        result = ({"passed": rng.randint(0, 90), "failed": rng.randint(0, 3)} if name == "run_tests"
                  else {"ok": True, "lines": rng.randint(1, 400)} if name in ("read_file", "write_file", "git_diff")
                  else {"matches": [f"src/{rng.choice(_WORDS)}.py:{rng.randint(1, 500)}" for _ in range(rng.randint(1, 3))]})
        lines.append(json.dumps({"role": "tool", "tool_call_id": call_id, "name": name, "content": result}))
    lines.append(json.dumps({"role": "assistant", "content": f"Done: the {w} change is in and the tests pass."}))
    return "\n".join(lines) + "\n"


def arithmetic_problem(rng: random.Random) -> str:
    """Return one word problem worked step by step, every step correct."""
    item = rng.choice(("boxes", "crates", "packs", "rows", "shelves"))
    a, b, c = rng.randint(3, 60), rng.randint(3, 40), rng.randint(2, 99)
    prod = a * b
    if rng.random() < 0.5:
        total, verb, sign = prod + c, "adds", "+"
    else:
        c = min(c, prod - 1)
        total, verb, sign = prod - c, "removes", "-"
    return (f"Problem: A store has {a} {item} with {b} items each. It {verb} {c} items. How many items are there now?\n"
            f"Step 1: {a} * {b} = {prod}.\nStep 2: {prod} {sign} {c} = {total}.\nAnswer: {total}\n\n")


def synthetic(domain: str, docs: int, seed: int) -> list[tuple[str, str]]:
    """Return `docs` (path, text) documents of a made-up domain, each ~3-6 KB, deterministic for a seed."""
    make = {"tools": tool_trace, "arithmetic": arithmetic_problem}[domain]
    out = []
    for i in range(docs):
        rng = random.Random(f"{seed}:{domain}:{i}")
        parts: list[str] = []
        while sum(map(len, parts)) < 3000 + (i % 4) * 1000:
            parts.append(make(rng))
        out.append((f"synthetic/{domain}/{i:05d}", "".join(parts)))
    return out


def domain_sources(domain: str, max_bytes: int, seed: int = 0) -> list[tuple[str, str]]:
    """Return the (path, text) documents of a domain, up to about `max_bytes`."""
    if domain == "python":
        from bench.reference.target import python_sources

        return python_sources(max_bytes)
    if domain in SUFFIXES:
        return files_with(SUFFIXES[domain], max_bytes)
    return synthetic(domain, max(8, max_bytes // 4500), seed)


def split_domains(max_bytes: dict[str, int], traffic_share: float, seed: int = 0) -> dict[str, SourceSplit]:
    """Return each domain's documents split into target text (train), candidate pool and traffic (heldout)."""
    from bench.reference.target import split_sources

    return {d: split_sources(domain_sources(d, n, seed), pool_share=0.3, heldout_share=traffic_share)
            for d, n in max_bytes.items()}
