"""Acceptance length, measured: speculative decoding with the target (transformers, KV cache) and a
draft, checked token for token against plain greedy decoding of the target.

One round, with `tokens` the sequence so far (its last token produced by the target and not yet
fed to it) and the target's KV cache holding every token before that one:

    draft:   propose K tokens d1..dK (a chain; with top-k, several root-to-leaf paths of a tree)
    target:  one forward over [last, d1..dK]  ->  its argmax g0..gK at each of the K+1 positions
    accept:  the longest prefix with d_i == g_{i-1}, plus the target's own next token g_a
    cache:   cropped to the accepted length (DynamicCache.crop); aux states of accepted positions kept

so every round costs one target forward and yields a+1 tokens: the acceptance length is their mean.
A tree is verified as a batch of its paths (cache repeated per path), still one target forward.

Sampled verification (`Sampling`, temperature > 0) is SGLang's target-only tree speculative
sampling with its default thresholds (1.0): at a node, the children are tried in order against one
coin and child c is accepted with probability p(c); when all are rejected the bonus token is drawn
from p without them. Drawing one token x ~ p per node and accepting the child equal to x has exactly
that law, so that is how it runs here: `argmax` becomes one draw per tree node. The output is then a
sample of the target at that temperature (the check against greedy decoding does not apply), and a
simulation on the sampled output's own states replays its cycles exactly (tests/training/eval/test_sampled_eval.py).

The draft's pairing follows EAGLE-3 training: the target's aux states at position j go with token
j+1 (the token the target chose after seeing j), at draft position j, and predict token j+2. Aux
states are the target's `hidden_states[L]` for each layer id L (SGLang convention: input of layer L).
"""

from __future__ import annotations

import inspect
import json
import math
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from training.eagle3.model import Eagle3Draft, KVCache
from training.errors import ModelMismatchError, TrainingError
from training.feed.batches import split_eval
from training.eagle3.objective import offline_metrics
from training.eval.simulate import AcceptanceStats, TreeBuilder, default_draft_tokens, simulate_acceptance, traffic_weighted
from training.storage.index import read_index
from training.storage.reader import HiddenStateStore
from training.target.head import TargetHead


class GreedyMismatchError(TrainingError):
    """Speculative decoding produced other tokens than greedy decoding of the target: a bug."""


@dataclass(frozen=True)
class Sampling:
    """The target's sampling in verification, applied as SGLang applies it: softmax(logits / T),
    then top-k, then top-p renormalisation (0 and 1.0 leave them off)."""

    temperature: float
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.temperature > 0 or not math.isfinite(self.temperature):
            raise TrainingError(f"temperature {self.temperature}: sampled verification needs a finite T > 0 "
                                "(greedy verification is the default)")
        if self.top_k < 0 or not 0 < self.top_p <= 1:
            raise TrainingError(f"top_k {self.top_k} must be >= 0 and top_p {self.top_p} in (0, 1]")
        if not 0 <= self.seed < 2**32:
            raise TrainingError(f"seed {self.seed} must be in [0, 2**32)")

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Return the sampling distribution [..., V] for logits [..., V]."""
        probs = torch.softmax(logits.float() / self.temperature, dim=-1)
        if 0 < self.top_k < probs.shape[-1]:
            kth = probs.topk(self.top_k, dim=-1).values[..., -1:]
            probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
        if self.top_p < 1:
            # SGLang's threshold (FlashInfer's): in ascending order, the first probability at which the
            # running mass reaches 1 - p is the pivot; every token at or above it stays, ties included
            probs = probs / probs.sum(-1, keepdim=True)
            ascending = probs.sort(dim=-1).values
            cut = torch.searchsorted(ascending.cumsum(-1), torch.full_like(ascending[..., :1], 1 - self.top_p))
            pivot = ascending.gather(-1, cut.clamp(max=ascending.shape[-1] - 1))
            probs = torch.where(probs >= pivot, probs, torch.zeros_like(probs))
        return probs / probs.sum(-1, keepdim=True)

    def generator(self, device: torch.device | str, key: str) -> torch.Generator:
        """Return a generator seeded from the seed and `key` (a prompt id): runs repeat, prompt by prompt."""
        return torch.Generator(device=device).manual_seed((self.seed << 32) ^ zlib.crc32(key.encode()))


def _draw_per_node(logits: torch.Tensor, drafted: torch.Tensor, lengths: torch.Tensor, sampling: Sampling,
                   generator: torch.Generator) -> torch.Tensor:
    """Return [P, W+1]: the target's sampled token at every node of the verified paths.

    Position i of path p is the node reached by its first i drafted tokens; paths that share those
    tokens share the node, so it is drawn once for all of them (independent draws per path would let
    the best path pick among several samples and overstate acceptance). Positions past a path's end
    are left 0: the accepted prefix is capped at the path's length, so they are never read.
    """
    n_paths, width = logits.shape[0], logits.shape[1]
    rows, ends = drafted.tolist(), lengths.tolist()  # one device sync each
    nodes: dict[tuple[int, ...], list[tuple[int, int]]] = {}
    for p in range(n_paths):
        for i in range(int(ends[p]) + 1):
            nodes.setdefault(tuple(rows[p][:i]), []).append((p, i))
    where = list(nodes.values())
    first = torch.tensor([w[0] for w in where], device=logits.device)
    drawn = torch.multinomial(sampling.probs(logits[first[:, 0], first[:, 1]]), 1, generator=generator)[:, 0].tolist()
    choice = [[0] * width for _ in range(n_paths)]  # filled on the host, moved once
    for positions, token in zip(where, drawn):
        for p, i in positions:
            choice[p][i] = token
    return torch.tensor(choice, dtype=torch.long, device=logits.device)


@dataclass
class EvalPrompt:
    """One prompt to decode: a conversation rendered with the target's chat template."""

    id: str
    messages: list[dict[str, Any]]
    category: str = ""


class Proposer(Protocol):
    """What proposes draft tokens. `aux_layer_ids` None: the proposer needs no target states."""

    aux_layer_ids: list[int] | None

    def begin(self, prompt_ids: list[int]) -> None:
        """Forget the previous sequence; a new one starts with these prompt tokens."""

    def propose(self, tokens: torch.Tensor, aux: torch.Tensor | None, steps: int, topk: int) -> list[list[int]]:
        """Return draft paths (target token ids, each `steps` long) continuing `tokens` [n].

        aux [n-1, 3*Ht] holds the target's aux states of every token but the last; a chain is
        one path, a tree with top-k several (at most `topk`)."""


class DraftProposer:
    """The EAGLE-3 draft as a proposer, with its own KV cache kept across rounds.

    The cache holds only positions fed with real target states; each round's drafted positions
    are cropped away at the start of the next, once verification has said which tokens stand.
    A tree (topk > 1) is grown as SGLang grows it (training.eval.simulate.TreeBuilder): beams of topk,
    each slot attending to the real prefix and its own slot's earlier keys, and the top
    `num_draft_tokens`-1 nodes by cumulative probability verified (None: steps+1 for a chain,
    every candidate for a tree).
    """

    def __init__(self, draft: Eagle3Draft, num_draft_tokens: int | None = None) -> None:
        self.draft = draft.eval()
        self.num_draft_tokens = num_draft_tokens
        self.aux_layer_ids: list[int] | None = list(draft.config.aux_layer_ids)
        if len(self.aux_layer_ids) != draft.config.num_aux_layers:
            raise ModelMismatchError(
                f"the draft records aux layer ids {self.aux_layer_ids} but fuses {draft.config.num_aux_layers} layers"
            )
        self.cache = KVCache()
        self.n_real = 0  # draft positions whose target states were real (not the draft's own)

    def begin(self, prompt_ids: list[int]) -> None:
        self.cache = KVCache()
        self.n_real = 0

    @torch.no_grad()
    def propose(self, tokens: torch.Tensor, aux: torch.Tensor | None, steps: int, topk: int) -> list[list[int]]:
        if aux is None:
            raise TrainingError("the EAGLE-3 draft needs the target's aux states")
        device = next(self.draft.parameters()).device
        dtype = self.draft.fc.weight.dtype
        n = tokens.shape[0]
        self.cache.crop(self.n_real)
        # pairs (token j+1, aux j) at draft position j, for every position not fed yet
        ids = tokens[self.n_real + 1 : n].to(device)[None]  # (1, T)
        hidden = aux[self.n_real : n - 1].to(device=device, dtype=dtype)[None]  # (1, T, 3Ht)
        out = self.draft(ids, hidden, cache=self.cache)
        self.n_real = n - 1
        builder = TreeBuilder(topk)
        beams = builder.first(out.logits[:, -1])[0]  # (k,) draft ids
        hidden = out.hidden[:, -1:].expand(topk, 1, -1)  # (k, 1, H)
        cache = self._batched(topk)
        for _ in range(steps - 1):
            step = self.draft(self.draft.draft_to_target(beams)[:, None], hidden, cache=cache)
            beams, parent_slot = builder.extend(step.logits[:, -1][None])  # (1, k) each
            beams, parent_slot = beams[0], parent_slot[0]
            hidden = step.hidden[parent_slot, -1:]  # (k, 1, H): each new beam reads its parent's state
            # the keys stay with their slot, as in SGLang's draft decode (not reordered by parent)
        tree = builder.tree()
        budget = default_draft_tokens(steps, topk, self.num_draft_tokens)
        paths = tree.paths(tree.selected(budget))
        to_target = self.draft.draft_to_target
        return [to_target(torch.tensor(p, device=device)).tolist() for p in paths]

    def _batched(self, n_paths: int) -> KVCache:
        """Return the cache for drafting: this one for a chain, a per-slot copy for a tree."""
        if n_paths == 1:
            return self.cache
        tree = KVCache()
        tree.k = self.cache.k.repeat(n_paths, 1, 1, 1)  # type: ignore[union-attr]
        tree.v = self.cache.v.repeat(n_paths, 1, 1, 1)  # type: ignore[union-attr]
        return tree


@dataclass
class SpecResult:
    """One prompt decoded speculatively: the new tokens and what each verification accepted."""

    tokens: list[int]
    accepted: list[int]  # draft tokens accepted per target verification forward
    draft_s: float = 0.0
    target_s: float = 0.0


@dataclass
class GreedyResult:
    """One prompt decoded greedily; margins[i] = top-1 minus top-2 logit when token i was chosen."""

    tokens: list[int]
    margins: list[float]
    seconds: float = 0.0


def _finish(tokens: list[int], max_new_tokens: int, eos_ids: set[int]) -> tuple[list[int], bool]:
    """Return tokens cut at the first end-of-sequence (kept) or the budget, and whether done."""
    for i, t in enumerate(tokens[:max_new_tokens]):
        if t in eos_ids:
            return tokens[: i + 1], True
    return tokens[:max_new_tokens], len(tokens) >= max_new_tokens


def _cache_keyword(target: Any) -> str:
    """Return the name of the KV-cache argument: `cache` in newer transformers, `past_key_values` before."""
    try:
        params = inspect.signature(target.forward).parameters
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


def _crop(cache: DynamicCache, keep: int) -> None:
    """Keep the first `keep` positions. A negative count removes tokens in every transformers 5.x
    (a positive one meant "final length" before 5.2x and is refused after)."""
    remove = cache.get_seq_length() - keep
    if remove > 0:
        cache.crop(-remove)


def _aux(hidden_states: Sequence[torch.Tensor], layer_ids: list[int] | None) -> torch.Tensor | None:
    """Return the aux states [B, T, 3*Ht] from `output_hidden_states` (index L = input of layer L)."""
    if layer_ids is None:
        return None
    return torch.cat([hidden_states[i] for i in layer_ids], dim=-1)


@torch.no_grad()
def greedy_decode(target: Any, prompt_ids: list[int], max_new_tokens: int, eos_ids: set[int]) -> GreedyResult:
    """Return the target's greedy continuation, one token per forward, with its logit margins."""
    device = target.device
    start = time.perf_counter()
    cache = DynamicCache(config=target.config)
    cache_kw = _cache_keyword(target)
    inputs = torch.tensor([prompt_ids], device=device)
    tokens: list[int] = []
    margins: list[float] = []
    while len(tokens) < max_new_tokens:
        logits = target(input_ids=inputs, use_cache=True, **{cache_kw: cache}).logits[0, -1].float()
        top2 = logits.topk(2).values
        tokens.append(int(logits.argmax()))
        margins.append(float(top2[0] - top2[1]))
        if tokens[-1] in eos_ids:
            break
        inputs = torch.tensor([[tokens[-1]]], device=device)
    return GreedyResult(tokens=tokens, margins=margins, seconds=time.perf_counter() - start)


@torch.no_grad()
def speculative_decode(
    target: Any, proposer: Proposer, prompt_ids: list[int], *, steps: int, topk: int,
    max_new_tokens: int, eos_ids: set[int], sampling: Sampling | None = None,
    generator: torch.Generator | None = None,
) -> SpecResult:
    """Return the tokens of speculative decoding with `proposer` and verification by `target`:
    greedy, or sampled with `sampling` (drawing from `generator`, one seeded by `sampling` if None)."""
    if steps < 1 or topk < 1:
        raise TrainingError(f"steps ({steps}) and topk ({topk}) must be at least 1")
    device = target.device
    layer_ids = proposer.aux_layer_ids
    want_hidden = layer_ids is not None
    n_layers = int(target.config.num_hidden_layers)
    if layer_ids is not None and any(not 0 <= i < n_layers for i in layer_ids):
        raise ModelMismatchError(f"aux layer ids {layer_ids} are outside the target's {n_layers} layers")
    proposer.begin(prompt_ids)
    result = SpecResult(tokens=[], accepted=[])
    cache = DynamicCache(config=target.config)
    cache_kw = _cache_keyword(target)

    t0 = time.perf_counter()
    out = target(input_ids=torch.tensor([prompt_ids], device=device), use_cache=True,
                 output_hidden_states=want_hidden, **{cache_kw: cache})
    result.target_s += time.perf_counter() - t0
    if sampling is not None and generator is None:
        generator = sampling.generator(device, "")
    first = out.logits[0, -1]
    if sampling is not None:
        first_token = int(torch.multinomial(sampling.probs(first), 1, generator=generator))
    else:
        first_token = int(first.argmax())
    seq = torch.tensor(prompt_ids + [first_token], device=device)  # (n,)
    aux = _aux(out.hidden_states, layer_ids)[0] if want_hidden else None  # (n-1, 3Ht)
    result.tokens, done = _finish([int(seq[-1])], max_new_tokens, eos_ids)

    while not done:
        t0 = time.perf_counter()
        paths = proposer.propose(seq, aux, steps, topk)
        result.draft_s += time.perf_counter() - t0
        if not paths or any(not 1 <= len(p) <= steps for p in paths):
            raise TrainingError(f"the proposer returned paths of lengths {[len(p) for p in paths]}, expected 1..{steps}")
        n_paths, n = len(paths), seq.shape[0]
        width = max(len(p) for p in paths)
        t0 = time.perf_counter()
        if n_paths > 1:
            cache.batch_repeat_interleave(n_paths)
        # a tree's shorter paths are padded: tokens past a path's end are never accepted
        verify = torch.tensor([[int(seq[-1])] + p + [p[-1]] * (width - len(p)) for p in paths], device=device)
        lengths = torch.tensor([len(p) for p in paths], device=device)  # (P,)
        positions = torch.arange(n - 1, n + width, device=device).expand(n_paths, -1)
        out = target(input_ids=verify, position_ids=positions, use_cache=True,
                     output_hidden_states=want_hidden, **{cache_kw: cache})
        drafted = verify[:, 1:]
        if sampling is not None:  # (P, W+1): the target's own token after each position
            choice = _draw_per_node(out.logits, drafted, lengths, sampling, generator)  # type: ignore[arg-type]
        else:
            choice = out.logits.argmax(-1)
        matches = (drafted == choice[:, :-1]).long().cumprod(-1).sum(-1).minimum(lengths)  # (P,) accepted prefixes
        best = int(matches.argmax())
        a = int(matches[best])
        if n_paths > 1:
            cache.batch_select_indices(torch.tensor([best], device=device))
        _crop(cache, n + a)  # keep [seq..., d1..da]; the bonus token is fed next round
        result.target_s += time.perf_counter() - t0
        new = drafted[best, :a].tolist() + [int(choice[best, a])]
        if want_hidden:
            aux = torch.cat([aux, _aux(out.hidden_states, layer_ids)[best, : a + 1]], dim=0)  # type: ignore[list-item]
        seq = torch.cat([seq, torch.tensor(new, device=device)])
        result.accepted.append(a)
        result.tokens, done = _finish(result.tokens + new, max_new_tokens, eos_ids)
    return result


@dataclass
class PromptRecord:
    """Per-prompt outcome, for the JSON report."""

    id: str
    category: str
    prompt_tokens: int
    new_tokens: int
    forwards: int
    acceptance_length: float
    greedy_match: str  # "exact" | "tie@i" (diverged at a near-tie of the target's logits) | "sampled"


@dataclass
class EvalReport:
    """The outcome of an evaluation run."""

    steps: int
    topk: int
    max_new_tokens: int
    overall: AcceptanceStats
    categories: dict[str, AcceptanceStats]
    prompts: list[PromptRecord]
    skipped: dict[str, int]  # reason -> count
    new_tokens: int = 0
    spec_s: float = 0.0
    draft_s: float = 0.0
    greedy_s: float = 0.0
    ties: int = 0
    offline: dict[str, Any] | None = None
    sampling: Sampling | None = None  # None: greedy verification, every output checked against greedy
    traffic: dict[str, Any] | None = None  # acceptance weighted by a traffic profile's shares (traffic_weighted)

    def skip(self, reason: str) -> None:
        """Count a prompt left out, by reason."""
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def to_json(self) -> dict[str, Any]:
        """Return the report as JSON-ready data (NaN, which JSON lacks, as null)."""
        return finite({
            "steps": self.steps, "topk": self.topk, "max_new_tokens": self.max_new_tokens,
            "prompts_decoded": len(self.prompts), "skipped": self.skipped, "new_tokens": self.new_tokens,
            "acceptance_length": self.overall.acceptance_length, "overall": self.overall.to_json(),
            "categories": {c: s.to_json() for c, s in sorted(self.categories.items())},
            "greedy_ties": self.ties,
            "sampling": asdict(self.sampling) if self.sampling is not None else None,
            "timing_s": {"speculative": self.spec_s, "draft": self.draft_s, "greedy": self.greedy_s},
            "offline_estimate": self.offline,
            "traffic_weighted": self.traffic,
            "per_prompt": [asdict(p) for p in self.prompts],
        })


def finite(value: Any) -> Any:
    """Return `value` with every non-finite float (NaN: nothing to measure) replaced by None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


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
        lines = path.read_text(encoding="utf-8").splitlines()
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
            row = json.loads(line)
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
        except (json.JSONDecodeError, ValueError, AttributeError):
            malformed += 1
    return prompts, malformed


def load_target(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> tuple[Any, Any]:
    """Return (model, tokenizer) of a local target, in eval mode on `device`."""
    if not (Path(path) / "config.json").is_file():
        # never fall through to a Hub download: eval measures the model on this disk
        raise TrainingError(f"{path} is not a local model directory (no config.json)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    except OSError as exc:
        raise TrainingError(f"cannot load the target from {path}: {exc}") from None
    return model.to(device).eval(), tokenizer


def eos_token_ids(target: Any, tokenizer: Any) -> set[int]:
    """Return every token id that ends a generation (config, generation config, tokenizer)."""
    ids: set[int] = set()
    for source in (getattr(target, "generation_config", None), target.config, tokenizer):
        value = getattr(source, "eos_token_id", None)
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return ids


def evaluate(
    target: Any,
    tokenizer: Any,
    proposer: Proposer,
    prompts: Iterable[EvalPrompt],
    *,
    steps: int = 3,
    topk: int = 1,
    max_new_tokens: int = 128,
    tie_margin: float = 1e-4,
    on_prompt: Callable[[PromptRecord], None] | None = None,
    sampling: Sampling | None = None,
) -> EvalReport:
    """Return acceptance statistics of speculative decoding over `prompts`, each checked against greedy.

    A prompt whose speculative output differs from greedy decoding fails the run, unless the
    greedy reference chose that token by a logit margin under `tie_margin` (numerically a tie,
    which batched and one-token forwards may break differently); such prompts are counted as
    ties and compared up to the divergence. With `sampling` the target samples (each prompt from
    its own seeded generator) and there is no greedy reference to compare with.
    """
    eos = eos_token_ids(target, tokenizer)
    max_pos = int(getattr(target.config, "max_position_embeddings", 0) or 0)
    report = EvalReport(steps=steps, topk=topk, max_new_tokens=max_new_tokens,
                        overall=AcceptanceStats(steps), categories={}, prompts=[], skipped={}, sampling=sampling)
    for prompt in prompts:
        try:
            ids = render_prompt(tokenizer, prompt.messages)
        except Exception as exc:  # jinja and tokenizer errors alike mean: this prompt cannot be rendered
            report.skip(f"unrenderable ({type(exc).__name__})")
            continue
        if not ids:
            report.skip("empty after rendering")
            continue
        if max_pos and len(ids) + max_new_tokens + steps + 1 > max_pos:
            report.skip("too long for the target's context")
            continue
        greedy = greedy_decode(target, ids, max_new_tokens, eos) if sampling is None else None
        t0 = time.perf_counter()
        spec = speculative_decode(target, proposer, ids, steps=steps, topk=topk, max_new_tokens=max_new_tokens,
                                  eos_ids=eos, sampling=sampling,
                                  generator=sampling.generator(target.device, prompt.id) if sampling else None)
        report.spec_s += time.perf_counter() - t0
        report.draft_s += spec.draft_s
        if greedy is not None:
            report.greedy_s += greedy.seconds
            match = _compare(prompt.id, spec.tokens, greedy, tie_margin)
            report.ties += match != "exact"
        else:
            match = "sampled"
        report.new_tokens += len(spec.tokens)
        report.overall.add(spec.accepted)
        report.categories.setdefault(prompt.category or "all", AcceptanceStats(steps)).add(spec.accepted)
        record = PromptRecord(id=prompt.id, category=prompt.category, prompt_tokens=len(ids),
                              new_tokens=len(spec.tokens), forwards=len(spec.accepted),
                              acceptance_length=1.0 + sum(spec.accepted) / len(spec.accepted) if spec.accepted else math.nan,
                              greedy_match=match)
        report.prompts.append(record)
        if on_prompt is not None:
            on_prompt(record)
    return report


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
        provenance = json.loads(config_path.read_text(encoding="utf-8")).get("curator") or {}
    except (OSError, json.JSONDecodeError, AttributeError) as exc:
        raise TrainingError(f"{config_path} is unreadable ({exc}); re-export the draft with curator export") from None
    ckpt = str(provenance.get("checkpoint") or "")
    try:
        meta = json.loads((Path(ckpt) / "meta.json").read_text(encoding="utf-8")) if ckpt else {}
    except (OSError, json.JSONDecodeError):
        meta = {}
    split = provenance.get("split") or meta.get("split")
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


def offline_estimate(
    draft: Eagle3Draft, store_path: str | Path, target_dir: str | Path, split: HeldOutSplit, *,
    steps: int, topk: int = 1, num_draft_tokens: int | None = None, max_samples: int | None = 512,
    max_new_tokens: int | None = None, traffic_shares: dict[str, float] | None = None,
    traffic_groups: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Return both offline estimates on the store's held-out samples (as the checkpoint split them):
    the simulated decoding (`simulated`, the figure to trust) and the teacher-forced acc/cond_acc;
    with `traffic_shares`, the simulated figure weighted by them too (`traffic_weighted`)."""

    store = HiddenStateStore.open(store_path)
    if not store.meta.has_final:
        raise TrainingError(f"store {store_path} has no final hidden states: the offline estimate needs the target's logits")
    stored_ids = list(store.meta.aux_layer_ids)
    if stored_ids != list(draft.config.aux_layer_ids):
        raise ModelMismatchError(
            f"store {store_path} holds layers {stored_ids} (inputs of layers), the draft fuses {draft.config.aux_layer_ids}"
        )
    held, how = split.held_out(store_path, store.ids())
    held = held[:max_samples] if max_samples is not None else held
    if not held:
        raise TrainingError(f"store {store_path} has no samples this draft did not train on ({how})")
    device = next(draft.parameters()).device
    head = TargetHead.from_pretrained(target_dir, dtype=torch.float32, device=device)
    sim = simulate_acceptance(draft, store, held, steps=steps, topk=topk, num_draft_tokens=num_draft_tokens,
                              target_head=head, max_new_tokens=max_new_tokens)
    teacher = offline_metrics(draft, store, held, steps, head)
    out = {"samples": len(held), "split": how, "checkpoint": split.checkpoint,
           "acceptance_length": sim.acceptance_length, "simulated": sim.to_json(), "teacher_forced": teacher}
    if traffic_shares is not None:
        out["traffic_weighted"] = traffic_weighted(sim.categories, traffic_shares, traffic_groups)
    return out


def _compare(prompt_id: str, spec: list[int], greedy: GreedyResult, tie_margin: float) -> str:
    """Return "exact" or "tie@i"; raise GreedyMismatchError on a real divergence."""
    ref = greedy.tokens
    for i, (s, g) in enumerate(zip(spec, ref)):
        if s != g:
            if greedy.margins[i] <= tie_margin:
                return f"tie@{i}"
            raise GreedyMismatchError(
                f"prompt {prompt_id!r}: speculative decoding gave token {s} at new position {i} where greedy "
                f"decoding of the target gives {g} (logit margin {greedy.margins[i]:.4g}); the verification "
                f"or cache handling is wrong, and measured acceptance would be meaningless"
            )
    if len(spec) != len(ref):
        raise GreedyMismatchError(
            f"prompt {prompt_id!r}: speculative decoding produced {len(spec)} tokens, greedy {len(ref)}"
        )
    return "exact"
