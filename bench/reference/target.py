"""The reference target: a code-chat Llama trained from a fixed seed on the Python sources that
lie on the machine, and the prompt pools cut from the same sources.

No model can be downloaded on the GPU machine, so the benchmark makes its own target. The
chat frame is `<|user|>` a code prefix `<|assistant|>` its continuation, so the target's
answers have the structure of code, and a draft has something real to learn. Files are split
into three disjoint groups by a hash of their path: the target's training text, the prompt
pools the drafts are trained from, and the held-out prompts they are evaluated on.

Runs with torch, transformers and tokenizers alone (the GPU machine's image).
"""

from __future__ import annotations

import hashlib
import random
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.reference.sources import read_texts
from training.target.toy import llama_config, save_target, train_causal_lm, train_tokenizer


@dataclass
class SourceSplit:
    """Python source texts split by file into target training text, prompt pool and held out."""

    train: list[str]
    pool: list[str]
    heldout: list[str]


def python_sources(max_bytes: int, roots: list[Path] | None = None) -> list[tuple[str, str]]:
    """Return (path, text) of .py files under the interpreter's library folders, sorted by path,
    up to `max_bytes` of text in all (files over 200 KB skipped: mostly generated tables)."""
    if roots is None:
        paths = sysconfig.get_paths()
        roots = sorted({Path(paths["stdlib"]), Path(paths["purelib"]), Path(paths["platlib"])})
    return read_texts(sorted({p for root in roots if root.exists() for p in root.rglob("*.py")}), max_bytes)


def split_sources(files: list[tuple[str, str]], pool_share: float = 0.25, heldout_share: float = 0.03) -> SourceSplit:
    """Return the files' texts split into three disjoint groups by a stable hash of the path."""
    split = SourceSplit([], [], [])
    for path, text in files:
        h = int.from_bytes(hashlib.sha256(path.encode()).digest()[:8], "big") / 2**64
        if h < heldout_share:
            split.heldout.append(text)
        elif h < heldout_share + pool_share:
            split.pool.append(text)
        else:
            split.train.append(text)
    return split


def code_windows(tokenizer, texts: list[str], prefix_tokens: int, cont_tokens: int, n: int, seed: int,
                 density: int = 1) -> list[tuple[str, str]]:
    """Return `n` (prefix, continuation) text pairs cut at random token offsets of `texts`: one
    window per 4 windows' worth of a text's tokens, `density` times as many where text is scarce."""
    rng = random.Random(seed)
    order = list(range(len(texts)))
    rng.shuffle(order)
    need = prefix_tokens + cont_tokens
    pairs: list[tuple[str, str]] = []
    batch = 256
    for start in range(0, len(order), batch):
        chunk = [texts[i] for i in order[start : start + batch]]
        for ids in tokenizer(chunk, add_special_tokens=False)["input_ids"]:
            if len(ids) < need:
                continue
            for _ in range(max(1, density * len(ids) // (4 * need))):
                off = rng.randrange(0, len(ids) - need + 1)
                pairs.append(
                    (tokenizer.decode(ids[off : off + prefix_tokens]), tokenizer.decode(ids[off + prefix_tokens : off + need]))
                )
                if len(pairs) >= n:
                    return pairs
    return pairs


def chat_rows(tokenizer, pairs: list[tuple[str, str]], seq_len: int) -> torch.Tensor:
    """Return the pairs framed as user/assistant chat, tokenised, padded/cut to [n, seq_len]."""
    texts = [f"<|user|>\n{p}<|end|>\n<|assistant|>\n{c}<|end|>\n" for p, c in pairs]
    rows = torch.full((len(texts), seq_len), tokenizer.pad_token_id, dtype=torch.long)
    for i, ids in enumerate(tokenizer(texts, add_special_tokens=False)["input_ids"]):
        ids = ids[:seq_len]
        rows[i, : len(ids)] = torch.tensor(ids)
    return rows


def build_reference_target(
    out_dir: str | Path,
    *,
    seconds: float = 150.0,
    steps: int | None = None,
    source_bytes: int = 60_000_000,
    vocab_size: int = 8192,
    hidden_size: int = 512,
    num_layers: int = 8,
    prefix_tokens: int = 128,
    cont_tokens: int = 128,
    batch_size: int = 64,
    lr: float = 1.5e-3,
    seed: int = 0,
    device: str = "cuda",
) -> dict[str, float]:
    """Train the reference target into `out_dir`; return its figures (params, tokens/s, loss)."""
    t0 = time.perf_counter()
    split = split_sources(python_sources(source_bytes))
    tokenizer = train_tokenizer(split.train[: max(1, len(split.train) // 3)], vocab_size=vocab_size)
    t_tok = time.perf_counter() - t0
    pairs = code_windows(tokenizer, split.train, prefix_tokens, cont_tokens, n=200_000, seed=seed)
    figures = train_target(out_dir, tokenizer, pairs, seconds=seconds, steps=steps, hidden_size=hidden_size,
                           num_layers=num_layers, seq_len=prefix_tokens + cont_tokens + 8, batch_size=batch_size,
                           lr=lr, seed=seed, device=device)
    return {**figures, "source_files": len(split.train) + len(split.pool) + len(split.heldout), "tokenizer_s": t_tok}


def train_target(
    out_dir: str | Path,
    tokenizer,
    pairs: list[tuple[str, str]],
    *,
    seconds: float,
    steps: int | None,
    hidden_size: int,
    num_layers: int,
    seq_len: int,
    batch_size: int,
    lr: float = 1.5e-3,
    seed: int = 0,
    device: str = "cuda",
) -> dict[str, float]:
    """Train a Llama on `pairs` framed as chat, for `seconds` (or exactly `steps`), save it with
    `tokenizer` into `out_dir`; return its figures (params, steps, tokens/s, loss, weights hash)."""
    config = llama_config(
        len(tokenizer),
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=hidden_size // 64,
        num_kv_heads=hidden_size // 64,
        intermediate_size=int(hidden_size * 2.75),
        max_position_embeddings=1024,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    # on the device before the step estimate times anything: the copy is not a training step
    rows = chat_rows(tokenizer, pairs, seq_len).to(device)
    t1 = time.perf_counter()
    if steps is None:
        # The cosine schedule is sized by the steps a few timed warm-up steps say will fit.
        est_steps = _estimate_steps(model, rows, batch_size, seconds, device)
        losses = train_causal_lm(model, rows, steps=est_steps, batch_size=batch_size, lr=lr, seed=seed, device=device,
                                 time_budget_s=seconds)
    else:
        # A fixed step count (no clock): a second run rebuilds the same target from the same seed.
        losses = train_causal_lm(model, rows, steps=steps, batch_size=batch_size, lr=lr, seed=seed, device=device)
    train_s = time.perf_counter() - t1
    save_target(model.to(torch.bfloat16), tokenizer, out_dir)
    digest = hashlib.sha256()
    for _name, p in sorted(model.state_dict().items()):
        digest.update(p.detach().float().cpu().numpy().tobytes())
    return {
        "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
        "train_s": train_s,
        "train_steps": len(losses),
        "train_tokens_per_s": len(losses) * batch_size * seq_len / train_s,
        "final_loss": sum(losses[-20:]) / max(1, len(losses[-20:])),
        # two runs with the same --target-steps and seed made the same target when these agree
        "weights_sha256": digest.hexdigest()[:16],
    }


def _estimate_steps(model, rows: torch.Tensor, batch_size: int, seconds: float, device: str) -> int:
    """Return how many optimizer steps fit in `seconds`, timed on a copy after warm-up steps
    (the first steps pay for CUDA start-up and kernel selection, and would make it far too few)."""
    import copy

    probe = copy.deepcopy(model)
    train_causal_lm(probe, rows, steps=3, batch_size=batch_size, device=device)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    n = 8
    start = time.perf_counter()
    train_causal_lm(probe, rows, steps=n, batch_size=batch_size, device=device)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    per_step = (time.perf_counter() - start) / n
    del probe
    return max(10, int(seconds / per_step))
