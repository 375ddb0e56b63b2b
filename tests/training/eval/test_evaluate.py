"""Speculative decoding with the tiny target: always greedy's output; acceptance measured honestly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import toy_corpus
from training.eagle3.model import DraftConfig, Eagle3Draft
from training.errors import TrainingError
from training.eval.decode import GreedyMismatchError, greedy_decode, speculative_decode
from training.eval.evaluate import evaluate
from training.eval.prompts import EvalPrompt, load_prompt_file, render_prompt
from training.eagle3.proposer import DraftProposer

STEPS = 3
MAX_NEW = 16
AUX_IDS = [1, 2, 3]  # inputs of layers 1..3 of the 4-layer tiny target


class GreedyOracle:
    """Test-only proposer: proposes the target's own greedy continuation (optionally beside decoys)."""

    aux_layer_ids = None

    def __init__(self, target, decoys: int = 0) -> None:
        self.target, self.decoys = target, decoys
        self.prompt_len, self.reference = 0, []

    def begin(self, prompt_ids: list[int]) -> None:
        self.prompt_len = len(prompt_ids)
        # no end-of-sequence stop: the oracle must be able to look past the budget
        self.reference = greedy_decode(self.target, prompt_ids, MAX_NEW + STEPS + 2, eos_ids=set()).tokens

    def propose(self, tokens, aux, steps, topk):
        done = tokens.shape[0] - self.prompt_len
        truth = self.reference[done : done + steps]
        decoys = [[(t + 1 + d) % self.target.config.vocab_size for t in truth] for d in range(self.decoys)]
        return [*decoys, truth]  # the right path last, so picking the first would be wrong


class Garbage:
    """Proposes a fixed token that the target never picks first: everything is rejected."""

    aux_layer_ids = None

    def begin(self, prompt_ids):
        pass

    def propose(self, tokens, aux, steps, topk):
        return [[3] * steps]


@pytest.fixture(scope="module")
def prompts() -> list[EvalPrompt]:
    lines = toy_corpus(4, seed=7)
    return [EvalPrompt(id=f"p{i}", category="code" if i % 2 else "chat",
                       messages=[{"role": "user", "content": line}]) for i, line in enumerate(lines)]


def random_draft(model, seed: int = 0) -> Eagle3Draft:
    torch.manual_seed(seed)
    cfg = DraftConfig.from_target_config(model.config.to_dict(), draft_vocab_size=200, aux_layer_ids=AUX_IDS)
    draft = Eagle3Draft(cfg)
    draft.load_embeddings(model.get_input_embeddings().weight)
    # a draft vocabulary that is not the identity: every second target id
    hot = torch.arange(0, 400, 2)
    t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    t2d[hot] = True
    draft.set_vocab(hot - torch.arange(200), t2d)
    return draft.eval()


def test_oracle_draft_reaches_maximal_acceptance_and_greedy_output(target, prompts) -> None:
    model, tokenizer = target
    report = evaluate(model, tokenizer, GreedyOracle(model), prompts, steps=STEPS, max_new_tokens=MAX_NEW, tie_margin=0.0)
    assert len(report.prompts) == len(prompts) and not report.skipped
    assert all(p.greedy_match == "exact" for p in report.prompts)
    assert report.overall.acceptance_length == pytest.approx(STEPS + 1)
    assert [r["rate"] for r in report.overall.position_rates()] == [1.0] * STEPS
    assert set(report.categories) == {"code", "chat"}


def test_tree_verification_finds_the_right_branch(target, prompts) -> None:
    model, tokenizer = target
    report = evaluate(model, tokenizer, GreedyOracle(model, decoys=2), prompts[:3], steps=STEPS, topk=3,
                      max_new_tokens=MAX_NEW, tie_margin=0.0)
    assert report.overall.acceptance_length == pytest.approx(STEPS + 1)
    assert all(p.greedy_match == "exact" for p in report.prompts)


def test_rejected_drafts_still_give_greedy_output_one_token_per_forward(target, prompts) -> None:
    model, tokenizer = target
    report = evaluate(model, tokenizer, Garbage(), prompts[:3], steps=STEPS, max_new_tokens=MAX_NEW, tie_margin=0.0)
    assert all(p.greedy_match == "exact" for p in report.prompts)
    assert report.overall.acceptance_length < 1.2


@pytest.mark.parametrize("topk", [1, 3])
def test_random_init_draft_accepts_about_one_token_and_matches_greedy(target, prompts, topk: int) -> None:
    model, tokenizer = target
    report = evaluate(model, tokenizer, DraftProposer(random_draft(model)), prompts, steps=STEPS, topk=topk,
                      max_new_tokens=MAX_NEW, tie_margin=0.0)
    assert all(p.greedy_match == "exact" for p in report.prompts)
    assert 1.0 <= report.overall.acceptance_length < 1.5
    assert report.new_tokens > 0 and report.overall.forwards > 0


def test_draft_proposals_do_not_depend_on_earlier_rounds(target, prompts) -> None:
    """Cropping the draft's cache after each round leaves it as if built from scratch."""
    model, tokenizer = target
    ids = render_prompt(tokenizer, prompts[0].messages)
    seq = torch.tensor(ids + greedy_decode(model, ids, 8, set()).tokens)
    with torch.no_grad():
        hs = model(seq[None, :-1], output_hidden_states=True).hidden_states
    aux = torch.cat([hs[i] for i in AUX_IDS], dim=-1)[0]
    draft = random_draft(model, seed=1)
    incremental = DraftProposer(draft)
    incremental.begin(ids)
    for n in (len(ids) + 1, len(ids) + 3, len(ids) + 4):
        incremental.propose(seq[:n], aux[: n - 1], STEPS, 1)
    fresh = DraftProposer(draft)
    fresh.begin(ids)
    assert incremental.propose(seq, aux, STEPS, 1) == fresh.propose(seq, aux, STEPS, 1)


class NoisyVerifier(torch.nn.Module):
    """A target whose multi-token forwards disagree with its one-token forwards (a broken verifier)."""

    def __init__(self, model) -> None:
        super().__init__()
        self.model, self.config, self.generation_config = model, model.config, model.generation_config

    @property
    def device(self):
        return self.model.device

    def forward(self, input_ids, cache=None, **kwargs):
        out = self.model(input_ids=input_ids, cache=cache, **kwargs)
        if input_ids.shape[1] > 1 and cache.get_seq_length() > input_ids.shape[1]:
            out.logits[..., 5] += 1e4  # token 5 wins every verified position
        return out


def test_output_that_differs_from_greedy_fails_the_run(target, prompts) -> None:
    model, tokenizer = target
    with pytest.raises(GreedyMismatchError, match="greedy"):
        evaluate(NoisyVerifier(model), tokenizer, GreedyOracle(model), prompts[:1], steps=STEPS,
                 max_new_tokens=MAX_NEW)


def test_generation_stops_at_end_of_sequence_inside_an_accepted_draft(target) -> None:
    model, tokenizer = target
    ids = render_prompt(tokenizer, [{"role": "user", "content": "def return value"}])
    ref = greedy_decode(model, ids, 8, set()).tokens
    stop = ref[4]  # pretend the 5th greedy token ends the turn; the oracle drafts right past it
    expected = ref[: ref.index(stop) + 1]
    spec = speculative_decode(model, GreedyOracle(model), ids, steps=STEPS, topk=1, max_new_tokens=50, eos_ids={stop})
    assert spec.tokens == expected == greedy_decode(model, ids, 50, {stop}).tokens


@pytest.mark.parametrize("paths", [[[3] * (STEPS + 1)], [[3], []], []])
def test_proposer_returning_paths_outside_1_to_k_tokens_is_refused(target, paths) -> None:
    model, tokenizer = target

    class Wrong(Garbage):
        def propose(self, tokens, aux, steps, topk):
            return paths

    with pytest.raises(TrainingError, match="lengths"):
        speculative_decode(model, Wrong(), [5, 6, 7], steps=STEPS, topk=1, max_new_tokens=8, eos_ids=set())


def test_tree_paths_of_different_lengths_are_verified_each_to_its_own_end(target) -> None:
    """A tree under a draft-token budget has shorter and longer paths; padding is never accepted."""
    model, tokenizer = target
    ids = render_prompt(tokenizer, [{"role": "user", "content": "def return value"}])
    ref = greedy_decode(model, ids, 40, set()).tokens

    class Ragged(Garbage):
        def begin(self, prompt_ids):
            self.n0 = len(prompt_ids)

        def propose(self, tokens, aux, steps, topk):
            done = tokens.shape[0] - self.n0
            truth = ref[done : done + steps]
            return [[truth[0]], [3] * steps]  # right but one token long, beside a wrong full path

    spec = speculative_decode(model, Ragged(), ids, steps=STEPS, topk=2, max_new_tokens=20, eos_ids=set())
    assert spec.tokens == ref[:20] and set(spec.accepted) == {1}


def test_prompt_file_counts_malformed_lines(tmp_path: Path) -> None:
    path = tmp_path / "prompts.jsonl"
    rows = [
        {"id": "a", "category": "code", "messages": [{"role": "system", "content": "s"},
                                                     {"role": "user", "content": "u1"},
                                                     {"role": "assistant", "content": "x"},
                                                     {"role": "user", "content": "u2"}]},
        {"prompt": "plain"},
        {"id": "c", "messages": "not a list"},
        {"id": "d", "messages": [{"role": "assistant", "content": "no user"}]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n{broken\n")
    prompts, malformed = load_prompt_file(path)
    assert [p.id for p in prompts] == ["a", "prompts-1"]
    assert [m["content"] for m in prompts[0].messages] == ["s", "u1"]  # answered turn by turn: the first one
    assert malformed == 3


def test_prompt_file_keeps_a_prompt_holding_unicode_line_separators(tmp_path) -> None:
    """JSON written with ensure_ascii=False holds U+2028, U+0085 and U+001C raw inside strings: each
    row is still one prompt (str.splitlines() cut them into malformed halves); CRLF text files too."""
    text = "first\u2028second\x85third\x1cfourth"
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps({"id": f"r{i}", "prompt": text}, ensure_ascii=False) for i in range(3)) + "\n",
                    encoding="utf-8")
    prompts, malformed = load_prompt_file(path)
    assert (malformed, [p.id for p in prompts]) == (0, ["r0", "r1", "r2"])
    assert prompts[0].messages[-1]["content"] == text
    plain = tmp_path / "p.txt"
    plain.write_bytes("one\r\ntwo \u2028 halves\r\n".encode())
    prompts, _ = load_prompt_file(plain)
    assert [p.messages[0]["content"] for p in prompts] == ["one", "two \u2028 halves"]


def write_store(model, tokenizer, root: Path, n: int = 12) -> Path:
    """A hidden-state store captured from the tiny target at AUX_IDS (answers = the target's greedy)."""
    from training.storage.format import HiddenStateSample, StoreMeta
    from training.storage.writer import StoreWriter

    meta = StoreMeta(target="tiny", hidden_size=model.config.hidden_size, num_layers=model.config.num_hidden_layers,
                     vocab_size=model.config.vocab_size, aux_layer_ids=AUX_IDS, dtype="bf16", has_final=True)
    with StoreWriter(root, meta) as writer:
        for i, line in enumerate(toy_corpus(n, seed=3)):
            ids = render_prompt(tokenizer, [{"role": "user", "content": line}])
            answer = greedy_decode(model, ids, 12, set()).tokens
            seq = torch.tensor(ids + answer)
            with torch.no_grad():
                hs = model(seq[None], output_hidden_states=True).hidden_states
            mask = torch.zeros(len(seq), dtype=torch.bool)
            mask[len(ids):] = True
            writer.add(HiddenStateSample(id=f"s{i}", input_ids=seq, loss_mask=mask,
                                         aux=torch.cat([hs[j] for j in AUX_IDS], -1)[0].bfloat16(),
                                         final=hs[-1][0].bfloat16(), category="code"))
    return root


def export_random_draft(model, tiny_target: Path, root: Path, fmt: str = "sglang", *, store: Path | None = None,
                        eval_fraction: float = 0.5, eval_data: Path | None = None) -> Path:
    """A draft checkpoint saved by the trainer's own function (with the split a run records) and exported."""
    from training.export.export import export_checkpoint
    from training.train.checkpoint import save_checkpoint

    draft = random_draft(model, seed=2)
    meta = {"step": 1, "draft_config": draft.config.to_dict(), "aux_layer_ids": AUX_IDS,
            "layer_convention": "sglang-input", "target_dir": str(tiny_target), "ttt_steps": STEPS,
            "store": {"path": str((store or root / "no-store").resolve())},
            "split": {"eval_fraction": eval_fraction, "eval_data": str(eval_data or ""), "eval_ids": [], "train_samples": 0}}
    ckpt = save_checkpoint(root / "run", draft.trainable_state_dict(), meta, None)
    return export_checkpoint(ckpt, root / f"export-{fmt}", fmt)


def test_offline_estimates_use_the_checkpoints_split_and_sit_beside_the_measured_one(target, prompts, tiny_target: Path, tmp_path: Path) -> None:
    from training.eagle3.offline import offline_estimate
    from training.eval.prompts import held_out_split
    from training.eagle3.load import load_draft
    from training.storage.reader import HiddenStateStore
    from training.feed.batches import split_eval

    model, tokenizer = target
    store = write_store(model, tokenizer, tmp_path / "store")
    export = export_random_draft(model, tiny_target, tmp_path, store=store, eval_fraction=0.5)
    draft = load_draft(export, tiny_target)
    offline = offline_estimate(draft, store, tiny_target, held_out_split(export), steps=STEPS)
    held = split_eval(HiddenStateStore.open(store).ids(), 0.5)[1]
    assert offline["samples"] == len(held) > 0 and "eval_fraction 0.5" in offline["split"]
    assert offline["simulated"]["samples"] == len(held) and len(offline["teacher_forced"]["acc"]) == STEPS
    measured = evaluate(model, tokenizer, DraftProposer(draft), prompts[:2], steps=STEPS, max_new_tokens=12)
    # an untrained draft: all say about one token per forward
    assert 1.0 <= offline["acceptance_length"] < 1.5 and 1.0 <= measured.overall.acceptance_length < 1.5


def test_estimate_on_the_training_store_of_a_run_with_a_separate_held_out_store_is_refused(target, tiny_target: Path, tmp_path: Path) -> None:
    from training.eval.prompts import held_out_split

    model, tokenizer = target
    train_store = write_store(model, tokenizer, tmp_path / "train", n=2)
    held_store = write_store(model, tokenizer, tmp_path / "held", n=2)
    export = export_random_draft(model, tiny_target, tmp_path, store=train_store, eval_data=held_store)
    split = held_out_split(export)
    with pytest.raises(TrainingError, match="trained on, all of it"):
        split.held_out(train_store, ["s0", "s1"])
    assert split.held_out(held_store, ["s1", "s0"])[0] == ["s0", "s1"]


def test_a_hash_split_carries_over_to_another_store_by_sample_id(target, tiny_target: Path, tmp_path: Path) -> None:
    from training.feed.batches import split_eval
    from training.eval.prompts import held_out_split
    from training.storage.reader import HiddenStateStore

    model, tokenizer = target
    store = write_store(model, tokenizer, tmp_path / "store", n=8)
    export = export_random_draft(model, tiny_target, tmp_path, store=store, eval_fraction=0.5)
    trained, held = split_eval(HiddenStateStore.open(store).ids(), 0.5)
    unseen, how = held_out_split(export).held_out(tmp_path / "copy", [*trained, *held])
    assert sorted(unseen) == sorted(held) and "another store" in how


def test_another_store_loses_the_ids_a_separate_held_out_run_trained_on(target, tiny_target: Path, tmp_path: Path) -> None:
    from training.eval.prompts import held_out_split

    model, tokenizer = target
    train_store = write_store(model, tokenizer, tmp_path / "train", n=3)
    held_store = write_store(model, tokenizer, tmp_path / "held", n=1)
    export = export_random_draft(model, tiny_target, tmp_path, store=train_store, eval_data=held_store)
    unseen, how = held_out_split(export).held_out(tmp_path / "other", ["s0", "s2", "new"])
    assert unseen == ["new"] and "2 sample id(s) that trained left out" in how


def test_a_draft_without_checkpoint_provenance_gets_no_offline_estimate(tmp_path: Path) -> None:
    from training.eval.prompts import held_out_split

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    with pytest.raises(TrainingError, match="held-out split is unknown"):
        held_out_split(tmp_path)


def write_mix(root: Path, rows: list[dict]) -> Path:
    from tests.fakes.openai_server import write_mix as write_finished_mix

    return write_finished_mix(root, rows)


def test_cli_eval_on_a_mix_reports_categories_and_offline_estimate(target, tiny_target: Path, tmp_path: Path) -> None:
    from curator.cli import main

    model, tokenizer = target
    store = write_store(model, tokenizer, tmp_path / "store", n=8)
    export = export_random_draft(model, tiny_target, tmp_path, store=store, eval_fraction=0.5)
    rows = [{"id": f"m{i}", "source": "toy", "category": ["agentic", "code", "chat"][i % 3],
             "messages": [{"role": "user", "content": line}], "turns": "all", "keep_responses": False}
            for i, line in enumerate(toy_corpus(9, seed=11))]
    rows.append({"id": "bad", "source": "toy", "category": "code", "messages": [], "turns": "all", "keep_responses": False})
    mix = write_mix(tmp_path / "mix", rows)
    out = tmp_path / "eval.json"
    code = main(["eval", "--model", str(tiny_target), "--draft", str(export), "--prompts", str(mix), "--limit", "6",
                 "--steps", str(STEPS), "--max-new-tokens", "10", "--data", str(store),
                 "--device", "cpu", "--json", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    assert report["prompts_decoded"] == 6 and report["skipped"] == {"malformed rows": 1}
    assert set(report["categories"]) == {"agentic", "code", "chat"}
    assert 1.0 <= report["acceptance_length"] <= STEPS + 1
    assert len(report["overall"]["per_position"]) == STEPS
    offline = report["offline_estimate"]
    assert offline["acceptance_length"] >= 1.0 and "eval_fraction 0.5" in offline["split"]
    assert set(offline["simulated"]["categories"]) == {"code"}  # the store's samples are all "code"
    assert all(p["greedy_match"] == "exact" for p in report["per_prompt"])


@pytest.mark.parametrize("fmt", ["sglang", "speculators"])
def test_doctor_passes_a_real_export_against_its_target_and_data(target, tiny_target: Path, tmp_path: Path, fmt: str) -> None:
    from curator.doctor import diagnose

    model, tokenizer = target
    export = export_random_draft(model, tiny_target, tmp_path, fmt)
    store = write_store(model, tokenizer, tmp_path / "store", n=2)
    report = diagnose(export, tiny_target, store)
    assert report.ok, [(c.name, c.detail) for c in report.errors]
    assert diagnose(export, tiny_target, store, report.launch_command).ok


def test_cli_eval_refuses_a_missing_target_in_one_line(tmp_path: Path) -> None:
    from curator.cli import main

    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    assert main(["eval", "--model", str(tmp_path / "nope"), "--draft", str(tmp_path), "--prompts", str(prompts)]) == 1


def test_divergence_at_a_declared_tie_is_counted_not_fatal(target, prompts) -> None:
    model, tokenizer = target
    report = evaluate(NoisyVerifier(model), tokenizer, GreedyOracle(model), prompts[:1], steps=STEPS,
                      max_new_tokens=MAX_NEW, tie_margin=float("inf"))
    assert report.ties == 1 and report.prompts[0].greedy_match.startswith("tie@")


def test_greedy_decodes_made_once_give_the_same_report_and_skip_the_target_s_greedy_pass(target, prompts) -> None:
    """Several drafts measured on the same prompts share one greedy pass (bench/reference_multidomain/fair.py)."""
    from training.eval.evaluate import eos_token_ids

    model, tokenizer = target
    draft = DraftProposer(random_draft(model, seed=2))
    eos = eos_token_ids(model, tokenizer)
    cache = {p.id: greedy_decode(model, render_prompt(tokenizer, p.messages), MAX_NEW, eos) for p in prompts[1:]}
    forwards: list[int] = []

    class Counting(torch.nn.Module):  # the target, counting its forwards
        def __init__(self) -> None:
            super().__init__()
            self.model, self.config, self.generation_config = model, model.config, model.generation_config

        @property
        def device(self):
            return self.model.device

        def forward(self, input_ids, **kwargs):
            forwards.append(input_ids.shape[1])
            return self.model(input_ids=input_ids, **kwargs)

    plain = evaluate(Counting(), tokenizer, draft, prompts, steps=STEPS, max_new_tokens=MAX_NEW, tie_margin=0.0)
    n_plain, forwards[:] = len(forwards), []
    cached = evaluate(Counting(), tokenizer, draft, prompts, steps=STEPS, max_new_tokens=MAX_NEW, tie_margin=0.0,
                      greedy=cache)
    assert [p.acceptance_length for p in cached.prompts] == [p.acceptance_length for p in plain.prompts]
    assert [p.greedy_match for p in cached.prompts] == [p.greedy_match for p in plain.prompts]
    assert cached.overall.acceptance_length == plain.overall.acceptance_length
    # greedy decoding makes one forward per token: the cached prompts' forwards were not made again
    assert n_plain - len(forwards) == sum(len(g.tokens) for g in cache.values()) > 0


def test_a_greedy_decode_made_for_another_token_budget_is_refused(target, prompts) -> None:
    model, tokenizer = target
    ids = render_prompt(tokenizer, prompts[0].messages)
    short = greedy_decode(model, ids, MAX_NEW // 2, set())
    with pytest.raises(TrainingError, match="max_new_tokens"):
        evaluate(model, tokenizer, DraftProposer(random_draft(model)), prompts[:1], steps=STEPS,
                 max_new_tokens=MAX_NEW, greedy={prompts[0].id: short})
