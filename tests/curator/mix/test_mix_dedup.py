"""Dedup: exact matches ignore case and spacing; near matches follow the Jaccard threshold."""

from __future__ import annotations

import random

import numpy as np

from curator.mix.dedup import Deduper, signature, signatures

WORDS = [f"w{i}" for i in range(3000)]


def _doc(rng: random.Random, n: int = 200) -> list[str]:
    return [rng.choice(WORDS) for _ in range(n)]


def _jaccard(a: list[str], b: list[str]) -> float:
    sa = {tuple(a[i : i + 5]) for i in range(len(a) - 4)}
    sb = {tuple(b[i : i + 5]) for i in range(len(b) - 4)}
    return len(sa & sb) / len(sa | sb)


def test_signature_agreement_estimates_jaccard():
    rng = random.Random(1)
    errors = []
    for _ in range(60):
        a = _doc(rng)
        b = [w if rng.random() > 0.05 else "x" for w in a]
        errors.append(float(np.mean(signature(" ".join(a)) == signature(" ".join(b)))) - _jaccard(a, b))
    assert abs(np.mean(errors)) < 0.02 and np.std(errors) < 0.06


def test_batch_and_single_signatures_agree_including_short_texts():
    texts = ["a", "a b c", "a b c d e", "one two three four five six seven", " ".join(_doc(random.Random(2)))]
    assert (signatures(texts) == np.stack([signature(t) for t in texts])).all()


def test_near_duplicates_found_and_distinct_texts_kept():
    rng = random.Random(4)
    dedup = Deduper(exact=True, near=0.8)
    originals = [_doc(rng) for _ in range(50)]
    for doc in originals:
        assert dedup.check(dedup.prepare([" ".join(doc)])[0], owner=0) is None
    edited = list(originals[7])
    edited[100] = "changed"  # 1 word of 200: Jaccard ~0.95
    match = dedup.check(dedup.prepare([" ".join(edited)])[0], owner=1)
    assert match is not None and match.kind == "near" and match.owner == 0
    exact = dedup.check(dedup.prepare(["  " + " ".join(originals[3]).upper() + "\n"])[0], owner=2)
    assert exact is not None and exact.kind == "exact"
    fresh = [_doc(rng) for _ in range(50)]
    assert all(dedup.check(p, owner=3) is None for p in dedup.prepare([" ".join(d) for d in fresh]))


def test_near_off_still_removes_exact_copies():
    dedup = Deduper(exact=True, near=None)
    first, again = dedup.prepare(["Hello  World", "hello world"])
    assert dedup.check(first, 0) is None and dedup.check(again, 1).kind == "exact"


def _edited_to(rng: random.Random, doc: list[str], low: float, high: float) -> list[str]:
    """Return a copy of `doc` with words replaced until its 5-gram Jaccard with `doc` lies in [low, high]."""
    while True:
        edited = list(doc)
        while _jaccard(doc, edited) > high:
            edited[rng.randrange(len(edited))] = f"edit{rng.randrange(10**9)}"
        if _jaccard(doc, edited) >= low:
            return edited


def _build(tmp_path, sources: dict[str, list[list[str]]], near: float) -> dict:
    import json

    from curator.mix import build_mix, recipe_from_dict

    specs = []
    for name, docs in sources.items():
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"conversations": [{"from": "human", "value": " ".join(d)}]}) + "\n" for d in docs))
        specs.append({"path": str(path), "name": name, "samples": len(docs)})
    manifest = build_mix(recipe_from_dict({"name": "near", "sources": specs, "dedup": {"exact": True, "near": near}}),
                         tmp_path / "mix")
    return {s["name"]: s for s in manifest["sources"]}


def test_near_duplicates_at_the_threshold_are_found_99_percent_of_the_time(tmp_path):
    rng = random.Random(12)
    originals = [_doc(rng, 300) for _ in range(200)]
    at_threshold = [_edited_to(rng, d, 0.85, 0.90) for d in originals]
    below = [_edited_to(rng, d, 0.70, 0.80) for d in originals[:100]]
    others = [_doc(rng, 300) for _ in range(200)]
    sources = _build(tmp_path, {"originals": originals + others, "near": at_threshold, "below": below}, near=0.85)
    assert sources["near"]["duplicates_near"] >= 198  # recall >= 99% for pairs at Jaccard 0.85-0.90
    assert sources["below"]["kept"] == 100  # and nothing under the threshold is taken for a duplicate
    assert sources["originals"]["kept"] == 400
