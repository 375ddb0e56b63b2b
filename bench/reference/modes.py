"""Text mode against token-exact mode on the same generations: the re-tokenisation mismatch share.

Token mode keeps the target's own prompt and completion ids per generation; text mode keeps the
text only, so hidden-state capture renders and tokenises it again. `text_copy` makes the text-mode
twin of a generation directory (the same answers, ids dropped) and `mismatch_share` counts the
records whose training rows differ between the two: ids the target never produced at those
positions, which the draft would be taught.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from training.io.atomic import write_text
from training.records.chat_tokens import MalformedRecordError, generation_files, iter_generation, tokenize_rows


def text_copy(gen_dir: str | Path, out_dir: str | Path) -> Path:
    """Write the text-mode twin of a token-mode generation directory (same records, no ids); return it."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for path in generation_files(gen_dir):
        lines = []
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            rec = json.loads(line)
            rec.pop("generations", None)
            rec.update(mode="text", mode_reason="text-mode twin made by the reference benchmark")
            lines.append(json.dumps(rec, ensure_ascii=False))
        write_text(out / path.name, "".join(line + "\n" for line in lines))
    return out


def _trained(row: Any) -> tuple[list[int], list[bool]]:
    # Up to the last trained token: what follows it (a newline after the end token) trains nothing.
    mask = row.loss_mask.tolist()
    end = max((i for i, m in enumerate(mask) if m), default=-1) + 1
    return row.input_ids.tolist()[:end], mask[:end]


def mismatch_share(gen_dir: str | Path, tokenizer: Any) -> dict[str, Any]:
    """Return how many token-mode records train on other ids once re-rendered and re-tokenised as text.

    A record mismatches when its text-mode rows differ from its token-mode rows in any id or mask
    position (the answers' ids, or the prompt ids before them); `end_token_added_only` counts those
    that differ only by the end token a cut-off answer gets back when re-rendered, and
    `share_answer_tokens_changed` the rest.
    """
    records = mismatched = end_only = masked = masked_wrong = 0
    for rec in iter_generation(gen_dir):
        if rec.get("mode") != "token":
            continue
        try:
            exact = tokenize_rows(rec)
            retok = tokenize_rows({**rec, "mode": "text"}, tokenizer)
        except MalformedRecordError:
            continue
        records += 1
        same = len(exact) == len(retok) and all(_trained(a) == _trained(b) for a, b in zip(exact, retok))
        mismatched += int(not same)
        want = [i for r in exact for i in r.input_ids[r.loss_mask].tolist()]
        got = [i for r in retok for i in r.input_ids[r.loss_mask].tolist()]
        # An answer cut off at max_tokens has no end token; its text re-rendered gets one the target
        # never wrote. Counted apart from answers whose own tokens change.
        end_only += int(not same and len(exact) == len(retok) == 1 and got[:-1] == want
                        and _trained(exact[0])[0] == _trained(retok[0])[0][:-1])
        masked += len(want)
        masked_wrong += sum(1 for a, b in zip(want, got) if a != b) + abs(len(want) - len(got))
    share = (lambda k: round(k / records, 4) if records else 0.0)
    return {"records": records, "mismatched": mismatched, "share": share(mismatched),
            "end_token_added_only": end_only, "share_answer_tokens_changed": share(mismatched - end_only),
            "answer_tokens": masked, "answer_tokens_differing": masked_wrong}
