"""Token ids read from a generation record are untrusted: an id at or past the target's vocabulary
would index past its embedding (an IndexError that takes down a whole capture), and one past 2^63
cannot even become a tensor (ValueError: Overflow). Each such record is one malformed record,
counted and skipped where it enters (`hidden-states`, `plan`), never a crash.
"""

from __future__ import annotations

from typing import Any

from training.chat_tokens import MalformedRecordError

INT64_LIMIT = 2**63  # torch.long holds ids below this


def generation_ids_problem(record: dict[str, Any], vocab_size: int | None = None) -> str | None:
    """Return what is wrong with the ids of a token-mode record's generations (an id negative, past
    2^63 - 1 or at/past `vocab_size`), or None. Other shape problems are left to the record's reader."""
    gens = record.get("generations")
    if record.get("mode") != "token" or not isinstance(gens, list):
        return None
    limit = min(vocab_size, INT64_LIMIT) if vocab_size else INT64_LIMIT
    for g in gens:
        if not isinstance(g, dict):
            continue
        for field in ("prompt_ids", "completion_ids"):
            ids = g.get(field)
            if not isinstance(ids, list):
                continue
            bad = next((i for i in ids if isinstance(i, int) and not 0 <= i < limit), None)
            if bad is not None:
                where = f"the vocabulary ({vocab_size})" if vocab_size and bad >= 0 else "the int64 range"
                return f"{field} holds token id {bad}, outside {where}"
    return None


def check_generation_ids(record: dict[str, Any], vocab_size: int | None = None) -> None:
    """Raise MalformedRecordError when a token-mode record holds an id the target cannot take."""
    problem = generation_ids_problem(record, vocab_size)
    if problem:
        raise MalformedRecordError(f"record {record.get('id')!r}: {problem}")
