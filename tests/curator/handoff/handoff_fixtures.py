"""Token-mode records (multi-turn, tool calls, a re-rendered history) and a store captured from them by the
tiny target, final state kept before and after the norm: the data the export tests hand off."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from training.capture.forward import load_target
from training.capture.hidden_states import extract
from training.capture.prepare import store_meta
from training.records.chat_tokens import iter_generation

TOOL_CALL = {"id": "call_1", "type": "function", "function": {"name": "run", "arguments": "{\"cmd\": \"ls\"}"}}


def token_record(i: int, vocab: int = 200) -> dict[str, Any]:
    """Record i: one answer (i % 3 == 0), a tool call then an answer sharing one row (1), or two answers
    whose second prompt re-renders the first (2: the first gets a row of its own, id `#2`)."""
    rng = random.Random(i)

    def ids(n: int) -> list[int]:
        return [rng.randrange(3, vocab) for _ in range(n)]

    p1, c1 = ids(rng.randint(6, 20)), ids(rng.randint(3, 12)) + [2]
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"task {i}", "train": False}]
    kind = i % 3
    if kind == 0:
        messages.append({"role": "assistant", "content": "done", "train": True})
        gens = [{"message": 1, "prompt_ids": p1, "completion_ids": c1}]
    else:
        first: dict[str, Any] = {"role": "assistant", "content": "", "train": True}
        if kind == 1:
            first = {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL], "train": True}
        messages += [first, {"role": "tool", "tool_call_id": "call_1", "content": "a.py"} if kind == 1
                     else {"role": "user", "content": "more", "train": False},
                     {"role": "assistant", "content": "ok", "train": True}]
        p2 = (p1 + c1 if kind == 1 else ids(4) + c1) + ids(rng.randint(3, 9))
        gens = [{"message": 1, "prompt_ids": p1, "completion_ids": c1},
                {"message": 3, "prompt_ids": p2, "completion_ids": ids(rng.randint(3, 10)) + [2]}]
    return {"id": f"r{i:03d}", "source": "test", "category": ["chat", "agentic", "code"][kind], "mode": "token",
            "model": "tiny", "messages": messages, "generations": gens}


def write_records(out: Path, n: int, vocab: int = 200) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "shard-00000.jsonl", "w", encoding="utf-8") as f:
        for i in range(n):
            f.write(json.dumps(token_record(i, vocab)) + "\n")
    return out


def capture_store(target_dir: Path, records: Path, out: Path, *, prenorm: bool = True, dtype: str = "bf16",
                  layer_ids: list[int] | None = None) -> Path:
    """Capture the tiny target's states of `records` into a store at `out` (the capture's own code)."""
    model, tok = load_target(target_dir, "cpu")
    meta = store_meta(model.config, tok, target=str(target_dir), layer_ids=layer_ids or [1, 2, 3], dtype=dtype,
                      has_final=True, has_final_prenorm=prenorm)
    extract(model, tok, iter_generation(records), out, meta)
    return out
