"""Hidden-state capture: the right layers, the right tokens and loss mask, resumable, data-parallel."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from training.records.chat_tokens import GenerationReadStats, iter_generation, tokenize_record, tokenize_rows
from training.capture.forward import capture_batch, load_target
from training.capture.hidden_states import extract
from training.capture.prepare import length_batches, store_meta
from training.capture.stats import ExtractStats
from training.storage.index import merge_index
from training.target.layers import default_aux_layers
from training.storage.reader import HiddenStateStore

ROOT = Path(__file__).resolve().parents[3]


def conversation(i: int) -> dict[str, Any]:
    """A generation-output record: multi-turn (turns=all), with reasoning on every other answer."""
    words = ["def value", "return self", "import json", "print data", "class model", "yield token"]
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "you write code", "train": False}]
    for k in range(1 + i % 3):
        msgs.append({"role": "user", "content": f"{words[(i + k) % 6]} {k}", "train": False})
        answer = {"role": "assistant", "content": " ".join(words[: 1 + (i * 7 + k) % 6]), "train": True}
        if (i + k) % 2:
            answer["reasoning_content"] = "think about the layer"
        msgs.append(answer)
    return {"id": f"c{i:03d}", "source": "test", "category": "code" if i % 2 else "chat", "turns": "all",
            "model": "tiny", "messages": msgs, "finish_reason": "stop"}


def write_gen(dir_: Path, records: list[Any], per_shard: int = 7) -> Path:
    dir_.mkdir(parents=True, exist_ok=True)
    for s in range(0, len(records), per_shard):
        with open(dir_ / f"shard-{s // per_shard:05d}.jsonl", "w") as f:
            for r in records[s : s + per_shard]:
                f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return dir_


@pytest.fixture(scope="module")
def target(tiny_target: Path) -> tuple[Any, Any]:
    return load_target(tiny_target, "cpu")


def masked_text(tok: Any, record: dict[str, Any]) -> str:
    t = tokenize_record(record, tok)
    return tok.decode(t.input_ids[t.loss_mask].tolist())


# ---------------------------------------------------------------- loss mask


def test_loss_mask_covers_answers_reasoning_and_end_token_not_headers(target: tuple[Any, Any]) -> None:
    _, tok = target
    rec = conversation(4)  # three turns, reasoning on the middle answer
    toks = tokenize_record(rec, tok)
    plain = [{k: v for k, v in m.items() if k != "train"} for m in rec["messages"]]
    assert toks.input_ids.tolist() == tok.apply_chat_template(plain, tokenize=True, return_dict=False)
    answers = [m for m in rec["messages"] if m["role"] == "assistant"]
    want = "".join(
        (f"<think>{m['reasoning_content']}</think>" if "reasoning_content" in m else "") + m["content"] + "<|end|>"
        for m in answers
    )
    assert masked_text(tok, rec) == want
    headers = {tok.convert_tokens_to_ids(t) for t in ("<|assistant|>", "<|user|>", "<|system|>")}
    assert not any(int(i) in headers for i in toks.input_ids[toks.loss_mask])


def test_loss_mask_of_turns_last_row_skips_context_answers(target: tuple[Any, Any]) -> None:
    _, tok = target
    rec = {"id": "x", "turns": "last", "messages": [
        {"role": "user", "content": "def value", "train": False},
        {"role": "assistant", "content": "old context answer", "train": False},
        {"role": "tool", "content": "json data", "train": False},
        {"role": "assistant", "content": "return self", "train": True},
    ]}
    assert masked_text(tok, rec) == "return self<|end|>"


def reasoning_dropping_template(target: tuple[Any, Any]) -> tuple[Any, dict[str, Any]]:
    """Return a tokenizer whose template renders reasoning only on the last answer, and a two-answer record."""
    _, tok = target
    tok2 = type(tok).from_pretrained(tok.name_or_path)
    tok2.chat_template = (
        "{% for m in messages %}{{ '<|' + m['role'] + '|>\n' }}"
        "{% if m['role'] == 'assistant' and m.get('reasoning_content') and loop.last %}"
        "{{ '<think>' + m['reasoning_content'] + '</think>' }}{% endif %}"
        "{{ m['content'] + '<|end|>\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
    )
    rec = {"id": "q", "messages": [
        {"role": "user", "content": "def value", "train": False},
        {"role": "assistant", "content": "return self", "reasoning_content": "hidden", "train": True},
        {"role": "user", "content": "print", "train": False},
        {"role": "assistant", "content": "yield token", "reasoning_content": "think data", "train": True},
    ]}
    return tok2, rec


def test_loss_mask_with_a_template_that_drops_earlier_reasoning(target: tuple[Any, Any]) -> None:
    """Qwen3-style templates render reasoning only on the last answer: prefixes are not prefixes."""
    tok2, rec = reasoning_dropping_template(target)
    # One row per generation: the first answer is trained in the context it was generated in
    # (with its own reasoning), never in the re-rendered history that drops that reasoning.
    rows = tokenize_rows(rec, tok2)
    assert [tok2.decode(r.input_ids[r.loss_mask].tolist()) for r in rows] == [
        "<think>think data</think>yield token<|end|>", "<think>hidden</think>return self<|end|>"]
    assert [r.suffix for r in rows] == ["", "#1"]


def test_a_record_split_into_rows_resumes_the_rows_a_kill_left_out(target: tuple[Any, Any]) -> None:
    """Rows of one record land in different shards: a kill can store `q` without `q#1`."""
    from training.capture.prepare import prepare_samples
    from training.capture.stats import ExtractStats

    tok2, rec = reasoning_dropping_template(target)
    stats = ExtractStats()
    left = [s.id for s in prepare_samples([rec], tok2, stats, done={"q"})]
    assert left == ["q#1"] and stats.already_done == 1
    assert [s.id for s in prepare_samples([rec], tok2, ExtractStats(), done={"q", "q#1"})] == []


def test_malformed_records_are_counted_and_skipped(tmp_path: Path, target: tuple[Any, Any]) -> None:
    model, tok = target
    records = [conversation(0), "{not json", json.dumps({"id": 5}), {"id": "bad", "messages": [{"role": "wizard", "content": "x"}]},
               {"id": "none", "messages": [{"role": "user", "content": "hi", "train": False}]}, conversation(1)]
    gen = write_gen(tmp_path / "gen", records)
    rs = GenerationReadStats()
    meta = store_meta(model.config, tok, target="tiny", layer_ids=None, dtype="bf16", has_final=True)
    stats = extract(model, tok, iter_generation(gen, rs), tmp_path / "store", meta)
    assert rs.malformed == 2 and stats.malformed == 2 and stats.stored == 2
    assert sorted(HiddenStateStore.open(tmp_path / "store").ids()) == ["c000", "c001"]


def test_max_len_clips_tokens_and_drops_samples_left_without_answers(tmp_path: Path, target: tuple[Any, Any]) -> None:
    model, tok = target
    gen = write_gen(tmp_path / "gen", [conversation(i) for i in range(6)])
    meta = store_meta(model.config, tok, target="tiny", layer_ids=None, dtype="bf16", has_final=True)
    stats = extract(model, tok, iter_generation(gen), tmp_path / "store", meta, max_len=12)
    store = HiddenStateStore.open(tmp_path / "store")
    assert all(store.length(i) <= 12 for i in store.ids())
    assert stats.no_loss_tokens > 0 and stats.stored + stats.no_loss_tokens == 6


def test_samples_past_the_targets_positions_are_skipped_and_counted(tmp_path: Path, target: tuple[Any, Any]) -> None:
    """Issue 49 item 3: a sample longer than max_position_embeddings ran without a word (minutes of
    forward pass, states past the positions meaningless); it is skipped as too_long, --max-len clips."""
    model, tok = target
    positions = model.config.max_position_embeddings
    long = conversation(1)
    long["id"] = "long"
    long["messages"][-1]["content"] = "def value " * positions  # well past the positions once tokenised
    gen = write_gen(tmp_path / "gen", [conversation(0), long, conversation(2)])
    meta = store_meta(model.config, tok, target="tiny", layer_ids=None, dtype="bf16", has_final=True)
    stats = extract(model, tok, iter_generation(gen), tmp_path / "store", meta)
    assert stats.too_long == 1 and stats.stored == 2 and stats.skipped == 1
    assert sorted(HiddenStateStore.open(tmp_path / "store").ids()) == ["c000", "c002"]
    clipped = extract(model, tok, iter_generation(gen), tmp_path / "clipped", meta, max_len=positions)
    assert clipped.too_long == 0 and clipped.stored == 3


def test_the_targets_positions_count_a_rope_factor_only_where_the_config_does_not() -> None:
    from training.capture.prepare import max_positions

    assert max_positions({"max_position_embeddings": 4096}) == 4096
    assert max_positions({"max_position_embeddings": 32768, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}) == 131072
    llama31 = {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}
    assert max_positions({"max_position_embeddings": 131072, "rope_scaling": llama31}) == 131072
    assert max_positions({"max_position_embeddings": -1}) is None and max_positions({}) is None


# ---------------------------------------------------------------- capture


def test_default_aux_layers_are_sglangs() -> None:
    assert default_aux_layers(61) == [2, 30, 58]  # Kimi-K2.5
    assert default_aux_layers(32) == [2, 16, 29]
    assert default_aux_layers(8) == [2, 4, 5]
    assert default_aux_layers(4) == [1, 2, 3]


def test_captured_states_equal_output_hidden_states_at_documented_indices(target: tuple[Any, Any]) -> None:
    model, _ = target
    n = model.config.num_hidden_layers
    ids = torch.randint(5, 400, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(input_ids=ids, output_hidden_states=True)
    layers = [1, 2, n]
    got = capture_batch(model, ids, None, layers)
    h = model.config.hidden_size
    for k, layer in enumerate(layers[:2]):
        # SGLang id L = input of layer L = hidden_states[L] (hidden_states[0] is the embedding output)
        assert torch.equal(got.aux[..., k * h : (k + 1) * h], ref.hidden_states[layer])
    last_pre_norm = got.aux[..., 2 * h :]
    # Id N is the last layer's output before the norm; hidden_states[-1] is after it (verified here).
    assert torch.allclose(model.model.norm(last_pre_norm), ref.hidden_states[-1], atol=1e-6)
    assert not torch.allclose(last_pre_norm, ref.hidden_states[-1])
    assert torch.equal(got.final, ref.hidden_states[n])
    logits = model.lm_head(got.final)
    assert torch.allclose(logits, ref.logits, atol=1e-5)


def test_padding_in_a_batch_does_not_change_a_samples_states(target: tuple[Any, Any]) -> None:
    model, _ = target
    a = torch.randint(5, 400, (1, 9), generator=torch.Generator().manual_seed(1))
    b = torch.randint(5, 400, (1, 4), generator=torch.Generator().manual_seed(2))
    batch = torch.zeros(2, 9, dtype=torch.long)
    batch[0], batch[1, :4] = a[0], b[0]
    mask = torch.zeros(2, 9, dtype=torch.long)
    mask[0], mask[1, :4] = 1, 1
    together = capture_batch(model, batch, mask, [1, 2, 3])
    alone = capture_batch(model, b, None, [1, 2, 3])
    assert torch.allclose(together.aux[1, :4], alone.aux[0], atol=1e-5)
    assert torch.allclose(together.final[1, :4], alone.final[0], atol=1e-5)


def test_length_batches_respect_the_padded_token_budget() -> None:
    lengths = [5, 100, 30, 31, 7, 64, 64, 3]
    batches = length_batches(lengths, 128)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 128


def test_stored_sample_matches_a_direct_forward(tmp_path: Path, target: tuple[Any, Any]) -> None:
    model, tok = target
    recs = [conversation(i) for i in range(9)]
    gen = write_gen(tmp_path / "gen", recs)
    meta = store_meta(model.config, tok, target="tiny", layer_ids=None, dtype="bf16", has_final=True)
    stats = extract(model, tok, iter_generation(gen), tmp_path / "store", meta, batch_tokens=96)
    assert stats.stored == 9 and stats.tokens > 0 and stats.bytes_written > 0
    store = HiddenStateStore.open(tmp_path / "store")
    assert store.meta.aux_layer_ids == [1, 2, 3] and store.meta.tokenizer_sha256 and store.meta.chat_template_sha256
    s = store["c005"]
    toks = tokenize_record(recs[5], tok)
    assert torch.equal(s.input_ids, toks.input_ids) and torch.equal(s.loss_mask, toks.loss_mask)
    ref = capture_batch(model, toks.input_ids[None], None, [1, 2, 3])
    assert torch.allclose(s.aux.float(), ref.aux[0].to(torch.bfloat16).float(), atol=1e-2, rtol=1e-2)
    assert torch.allclose(s.final.float(), ref.final[0].to(torch.bfloat16).float(), atol=1e-2, rtol=1e-2)
    assert s.category == "code"


def test_resume_after_interruption_loses_and_duplicates_nothing(tmp_path: Path, target: tuple[Any, Any]) -> None:
    model, tok = target
    recs = [conversation(i) for i in range(20)]
    gen = write_gen(tmp_path / "gen", recs)
    meta = store_meta(model.config, tok, target="tiny", layer_ids=None, dtype="bf16", has_final=True)
    calls = {"n": 0}

    def die_after_three(samples: int, tokens: int) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        extract(model, tok, iter_generation(gen), tmp_path / "store", meta, batch_tokens=64, window=4,
                shard_max_bytes=20_000, on_batch=die_after_three)
    partial = HiddenStateStore.open(tmp_path / "store").ids()
    assert 0 < len(partial) < 20
    stats = extract(model, tok, iter_generation(gen), tmp_path / "store", meta)
    assert stats.already_done == len(partial) and stats.stored == 20 - len(partial)
    merge_index(tmp_path / "store")
    store = HiddenStateStore.open(tmp_path / "store")
    assert sorted(store.ids()) == sorted(r["id"] for r in recs)
    clean = tmp_path / "clean"
    extract(model, tok, iter_generation(gen), clean, meta)
    ref = HiddenStateStore.open(clean)
    for sid in ("c000", "c013", "c019"):
        assert torch.allclose(store[sid].aux.float(), ref[sid].aux.float(), atol=1e-2)


def test_hidden_states_refuses_a_shards_link_planted_in_out(
    tmp_path: Path, tiny_target: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`hidden-states --out st` with st/shards a link once wrote its shards outside (sweep 2026-12-04 item 3)."""
    from curator.cli import main

    gen = write_gen(tmp_path / "gen", [conversation(i) for i in range(3)])
    outside = tmp_path / "outside"
    outside.mkdir()
    store = tmp_path / "store"
    store.mkdir()
    (store / "shards").symlink_to(outside, target_is_directory=True)
    assert main(["hidden-states", "--model", str(tiny_target), "--data", str(gen), "--out", str(store)]) == 1
    assert "shards is a link" in capsys.readouterr().err
    assert list(outside.iterdir()) == [] and not (store / "meta.json").exists()


def test_rerun_with_another_world_size_completes_the_store(tmp_path: Path, target: tuple[Any, Any]) -> None:
    model, tok = target
    recs = [conversation(i) for i in range(16)]
    gen = write_gen(tmp_path / "gen", recs)
    meta = store_meta(model.config, tok, target="tiny", layer_ids=None, dtype="bf16", has_final=True)
    out = tmp_path / "store"
    first = extract(model, tok, iter_generation(gen), out, meta, rank=0, world_size=2)  # rank 1 of 2 died
    assert 0 < first.stored < 16 and first.other_rank == 16 - first.stored
    totals = ExtractStats()
    for rank in range(3):
        totals.add(extract(model, tok, iter_generation(gen), out, meta, rank=rank, world_size=3))
    assert totals.stored == 16 - first.stored
    merge_index(out)
    store = HiddenStateStore.open(out)
    assert sorted(store.ids()) == sorted(r["id"] for r in recs) and len(store) == 16


def test_fp8_store_round_trip_error_is_bounded(tmp_path: Path, target: tuple[Any, Any]) -> None:
    model, tok = target
    gen = write_gen(tmp_path / "gen", [conversation(i) for i in range(6)])
    for dtype in ("bf16", "fp8"):
        meta = store_meta(model.config, tok, target="tiny", layer_ids=None, dtype=dtype, has_final=True)
        extract(model, tok, iter_generation(gen), tmp_path / dtype, meta)
    b16, f8 = HiddenStateStore.open(tmp_path / "bf16"), HiddenStateStore.open(tmp_path / "fp8")
    assert f8.meta.dtype == "fp8" and f8.disk_bytes() < 0.75 * b16.disk_bytes()
    for sid in b16.ids():
        e, a = b16[sid], f8[sid]
        for x, y in ((a.aux, e.aux), (a.final, e.final)):
            rel = (x.float() - y.float()).norm() / y.float().norm()
            assert rel < 0.05


# ---------------------------------------------------------------- GPU bench logic, tiny on CPU


def test_gpu_bench_logic_runs_tiny_on_cpu(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("hidden_states_gpu", ROOT / "bench" / "hidden_states_gpu.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    result = bench.run_bench(hidden=64, layers=4, heads=4, kv_heads=2, vocab=300, seq=32, samples=6, batch=2,
                             out_dir=tmp_path, device="cpu", peak_size=128, warmup=1,
                             disk_probe_bytes=3 * 1024**2)
    assert result["tokens"] == 6 * 32 and result["tokens_per_s"] > 0
    assert result["disk_write_gb_per_s"] > 0 and not list(tmp_path.glob(".disk-probe-*"))
    for figures in result["per_dtype"].values():
        assert set(figures["loop_s"]) == {"forward", "queue_copy", "writer_backpressure", "drain"}
        assert 0 < figures["fraction_of_disk"]
    assert result["bytes_per_token"]["bf16"] == 4 * 64 * 2 + 5
    assert result["bytes_per_token"]["fp8"] < result["bytes_per_token"]["bf16"]
    assert 0 < result["fraction_of_peak"] and result["peak_tflops"] > 0
    assert result["stored_samples"] == 6


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_async_host_copy_matches_a_plain_copy(dtype: str) -> None:
    from training.capture.forward import CapturedStates
    from training.capture.host import HostCopier
    from training.storage.format import StoreMeta
    from training.storage.fp8 import quantize_fp8

    g = torch.Generator(device="cuda").manual_seed(0)
    aux = torch.randn(2, 16, 3 * 32, device="cuda", generator=g, dtype=torch.bfloat16)
    final = torch.randn(2, 16, 32, device="cuda", generator=g, dtype=torch.bfloat16)
    meta = StoreMeta(target="t", hidden_size=32, num_layers=8, vocab_size=100, aux_layer_ids=[1, 3, 5], dtype=dtype)
    host = HostCopier()(CapturedStates(aux, final), meta)
    assert host.aux.is_pinned() and host.ready is not None
    host.wait()
    if dtype == "bf16":
        assert torch.equal(host.aux, aux.cpu()) and torch.equal(host.final, final.cpu())
    else:
        q, scale = quantize_fp8(aux.reshape(32, -1), 3)
        assert torch.equal(host.aux.view(torch.uint8), q.reshape(2, 16, -1).cpu().view(torch.uint8))
        assert torch.equal(host.aux_scale, scale.reshape(2, 16, 3).cpu())


def _token_record(sid: str, completion_ids: list[int]) -> dict[str, Any]:
    return {"id": sid, "mode": "token", "messages": [
        {"role": "user", "content": "a", "train": False}, {"role": "assistant", "content": "b", "train": True}],
        "generations": [{"message": 1, "prompt_ids": [5, 6, 7], "completion_ids": completion_ids}]}


def test_token_ids_past_the_vocabulary_or_int64_are_one_malformed_record_each(
    tmp_path: Path, target: tuple[Any, Any]
) -> None:
    model, tok = target
    vocab = model.config.vocab_size
    records = [conversation(0), _token_record("at_vocab", [8, vocab]), _token_record("huge", [8, 2**64]),
               _token_record("ok", [8, 9])]
    gen = write_gen(tmp_path / "gen", records)
    meta = store_meta(model.config, tok, target="tiny", layer_ids=None, dtype="bf16", has_final=True)
    stats = extract(model, tok, iter_generation(gen), tmp_path / "store", meta)
    assert stats.malformed == 2 and stats.stored == 2
    assert sorted(HiddenStateStore.open(tmp_path / "store").ids()) == ["c000", "ok"]


SIGTERM_RUNNER = """
import os, signal, sys
import curator.commands.hidden_states as hs
from curator.cli import main

real = hs.progress
def progress(*a, **k):
    bar = real(*a, **k)
    advance, seen = bar.advance, []
    def advance_then_term(task, n=1):
        advance(task, n)
        seen.append(n)
        if len(seen) == 3:  # a few batches done, all of them still in the shard buffer
            os.kill(os.getpid(), signal.SIGTERM)
    bar.advance = advance_then_term
    return bar
hs.progress = progress
sys.exit(main(sys.argv[1:]))
"""


def test_sigterm_keeps_the_captured_samples_as_ctrl_c_does(tiny_target: Path, tmp_path: Path) -> None:
    """SIGTERM once ended hidden-states at -15 with 0 samples stored (issue 38 item 13)."""
    import signal
    import subprocess
    import sys

    gen = write_gen(tmp_path / "gen", [conversation(i) for i in range(40)])
    store = tmp_path / "store"
    proc = subprocess.run([sys.executable, "-c", SIGTERM_RUNNER, "hidden-states", "--model", str(tiny_target),
                           "--data", str(gen), "--out", str(store), "--batch-tokens", "64", "--force"],
                          cwd=Path(__file__).resolve().parents[3], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 130 != -signal.SIGTERM, proc.stderr[-2000:]
    kept = HiddenStateStore.open(store).ids()
    assert 0 < len(kept) < 40
    assert not list(store.glob(".*.lock"))  # the lock let go
