"""The prompts `curator eval` decodes: prompt files, rendering, the held-out split a draft records, and
spreading a limit over categories.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.io.export_folder import provenance
from training.errors import TrainingError
from training.feed.batches import split_eval
from training.io.jsonfile import JSONFileError, parse_json, read_json
from training.storage.index import read_index


@dataclass
class EvalPrompt:
    """One prompt to decode: a conversation rendered with the target's chat template."""

    id: str
    messages: list[dict[str, Any]]
    category: str = ""


def prompt_messages(messages: list[dict[str, Any]], turns: str = "all") -> list[dict[str, Any]]:
    """Return the context to answer: for turns=last the conversation up to its last user/tool turn,
    otherwise up to the first user turn (later turns presume answers the target has not given)."""
    msgs = [{k: v for k, v in m.items() if k in ("role", "content", "reasoning_content")} for m in messages]
    if turns == "last":
        while msgs and msgs[-1]["role"] == "assistant":
            msgs.pop()
        return msgs
    for i, m in enumerate(msgs):
        if m["role"] == "user":
            return msgs[: i + 1]
    return []


def render_prompt(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    """Return the token ids of `messages` with the chat template and the generation prompt."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return list(tokenizer("\n".join(str(m["content"]) for m in messages))["input_ids"])


def load_prompt_file(path: str | Path) -> tuple[list[EvalPrompt], int]:
    """Return prompts from a JSONL file ({"id", "category", "messages"} or {"prompt"}) or a text file
    (one prompt per line), and the number of malformed lines skipped."""
    path = Path(path)
    try:
        # "\n" only: str.splitlines() also cuts at U+2028, U+0085 and the like, which JSON written
        # with ensure_ascii=False holds raw inside a string (a prompt would become two malformed lines)
        lines = [line.removesuffix("\r") for line in path.read_text(encoding="utf-8").split("\n")]
    except FileNotFoundError:
        raise TrainingError(f"prompt file {path} does not exist") from None
    prompts: list[EvalPrompt] = []
    malformed = 0
    jsonl = path.suffix in (".jsonl", ".json")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        if not jsonl:
            prompts.append(EvalPrompt(id=f"{path.stem}-{i}", messages=[{"role": "user", "content": line}]))
            continue
        try:
            row = parse_json(line)  # ValueError also for a 5,000-digit integer or nesting 100K deep
            messages = row.get("messages")
            if messages is None and isinstance(row.get("prompt"), str):
                messages = [{"role": "user", "content": row["prompt"]}]
            if not (isinstance(messages, list) and messages
                    and all(isinstance(m, dict) and isinstance(m.get("role"), str)
                            and isinstance(m.get("content"), str) for m in messages)):
                raise ValueError("no messages")
            messages = prompt_messages(messages, str(row.get("turns", "all")))
            if not messages:
                raise ValueError("no user turn")
            prompts.append(EvalPrompt(id=str(row.get("id", f"{path.stem}-{i}")), messages=messages,
                                      category=str(row.get("category") or "")))
        except (ValueError, AttributeError):
            malformed += 1
    return prompts, malformed


def spread_by_category(prompts: Sequence[EvalPrompt], limit: int | None) -> list[EvalPrompt]:
    """Return at most `limit` prompts taken round-robin over categories (so every one is measured)."""
    if limit is None or limit >= len(prompts):
        return list(prompts)
    queues: dict[str, list[EvalPrompt]] = {}
    for p in prompts:
        queues.setdefault(p.category, []).append(p)
    picked: list[EvalPrompt] = []
    depth = 0
    while len(picked) < limit:
        for queue in queues.values():
            if depth < len(queue) and len(picked) < limit:
                picked.append(queue[depth])
        depth += 1
    return picked


@dataclass
class HeldOutSplit:
    """Which samples the draft never trained on, as its run recorded the split."""

    checkpoint: str
    train_store: str  # the store the run trained on (resolved path; "" when its checkpoint is gone)
    eval_store: str  # a separate held-out store (eval_data), or "" when the split is by id hash
    eval_fraction: float

    def held_out(self, data: str | Path, ids: Sequence[str]) -> tuple[list[str], str]:
        """Return (ids of store `data` the draft never trained on, how that was decided).

        A hash split holds a sample out by its id alone, so it carries over to any store. A run
        with a separate held-out store trained on every sample of its training store: that store
        is refused, and another store loses the ids the training store has.
        """

        path = str(Path(data).resolve())
        if not self.eval_store:
            held = split_eval(ids, self.eval_fraction)[1]
            where = "the training store" if path == self.train_store else "another store, by the same id hash"
            return held, f"held-out split of {where} (eval_fraction {self.eval_fraction}, from the checkpoint)"
        if path == self.eval_store:
            return sorted(ids), "the run's separate held-out store (eval_data)"
        if path == self.train_store:
            raise TrainingError(
                f"{data} is the store this draft trained on, all of it (its run held out {self.eval_store}): "
                f"pass --data {self.eval_store}"
            )
        if not self.train_store or not (Path(self.train_store) / "meta.json").is_file():
            raise TrainingError(
                f"{data} is not the run's held-out store ({self.eval_store}), and its training store "
                f"{self.train_store or '(unknown)'} is gone: which samples trained cannot be checked"
            )

        trained = read_index(Path(self.train_store))[0].keys()  # the ids only: no shards opened or checked
        unseen = [sid for sid in ids if sid not in trained]
        return unseen, f"another store; {len(ids) - len(unseen)} sample id(s) that trained left out"


def held_out_split(draft_dir: str | Path) -> HeldOutSplit:
    """Return the held-out split recorded for an export (config.json `curator`: its split and checkpoint).

    The split is never typed again by hand: a wrong --eval-fraction would put trained samples in
    the estimate.
    """
    config_path = Path(draft_dir) / "config.json"
    try:
        config = read_json(config_path)
        if not isinstance(config, dict):
            raise TypeError("not a JSON object")
    except (OSError, JSONFileError, TypeError) as exc:
        raise TrainingError(f"{config_path} is unreadable ({exc}); re-export the draft with curator export") from None
    record = provenance(config)
    ckpt = str(record.get("checkpoint") or "")
    try:
        meta = read_json(Path(ckpt) / "meta.json") if ckpt else {}
    except (OSError, JSONFileError):
        meta = {}
    if not isinstance(meta, dict):
        meta = {}
    split = record.get("split") or meta.get("split")
    if not isinstance(split, dict):  # checkpoints written before the split was recorded on its own
        cfg = meta.get("train_config")
        split = {"eval_data": cfg.get("eval_data") or "", "eval_fraction": cfg.get("eval_fraction")} if isinstance(cfg, dict) else None
    if not split or split.get("eval_fraction") is None:
        raise TrainingError(
            f"{draft_dir} records no training split (curator.split, or a readable curator.checkpoint): its "
            "held-out split is unknown, so --data cannot be estimated without risking trained samples; "
            "export the draft with curator export"
        )
    store = (meta.get("store") or {}).get("path") or ""
    eval_store = str(Path(split["eval_data"]).resolve()) if split.get("eval_data") else ""
    return HeldOutSplit(checkpoint=ckpt, train_store=str(store), eval_store=eval_store,
                        eval_fraction=float(split["eval_fraction"]))


