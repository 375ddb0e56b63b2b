"""Small chat targets made on the spot: a BPE tokenizer with a chat template, a Llama config,
and a short causal-LM training loop.

No model can be downloaded on CI machines or air-gapped GPU nodes, so the tests, the demo and
the reference benchmark build their target here. The chat frame is the one every stage of
the toolkit sees from a real target: `tokenizer.apply_chat_template` with roles system, user,
assistant and tool, reasoning rendered from `reasoning_content` inside <think> tags.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from training.io.diskspace import named_disk_full

PAD, EOS, BOS = "<|pad|>", "<|end|>", "<|begin|>"
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"]
THINK_TOKENS = ["<think>", "</think>"]
SPECIAL_TOKENS = [PAD, EOS, BOS, *ROLE_TOKENS, *THINK_TOKENS]

# Each turn: role header, newline, [<think>reasoning</think>], content, <|end|>, newline.
# The end-of-turn token belongs to the answer (the draft must learn to stop).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' }}"
    "{% if message['role'] == 'assistant' and message.get('reasoning_content') %}"
    "{{ '<think>' + message['reasoning_content'] + '</think>' }}"
    "{% endif %}"
    "{{ message['content'] + '<|end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """Return a byte-level BPE tokenizer trained on `texts`, with the chat template set."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=[*ROLE_TOKENS, *THINK_TOKENS],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def llama_config(
    vocab_size: int,
    *,
    hidden_size: int = 64,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 1024,
    pad_token_id: int = 0,
    eos_token_id: int = 1,
    bos_token_id: int = 2,
) -> LlamaConfig:
    """Return a Llama config of the given shape (tie_word_embeddings off, as in large targets)."""
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        intermediate_size=intermediate_size or 4 * hidden_size,
        max_position_embeddings=max_position_embeddings,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        bos_token_id=bos_token_id,
    )


def build_target(
    texts: Sequence[str],
    out_dir: str | Path,
    *,
    vocab_size: int = 1024,
    seed: int = 0,
    **config_kwargs: int,
) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """Train a tokenizer on `texts`, build a random-init Llama around it, save both to `out_dir`."""
    tokenizer = train_tokenizer(texts, vocab_size=vocab_size)
    config = llama_config(
        len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        **config_kwargs,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    save_target(model, tokenizer, out_dir)
    return model, tokenizer


def save_target(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, out_dir: str | Path) -> Path:
    """Write model (safetensors) and tokenizer (with chat template) to `out_dir`; return it."""
    out = Path(out_dir)
    # a full disk is "disk full at OUT: N bytes free", not safetensors' "SafetensorError ... (os error 28)"
    with named_disk_full(out):
        out.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
    return out


def chat_token_batches(
    tokenizer: PreTrainedTokenizerFast,
    conversations: Sequence[list[dict[str, str]]],
    seq_len: int,
) -> torch.Tensor:
    """Return every conversation rendered with the chat template, concatenated and cut into
    rows of `seq_len` tokens: [n_rows, seq_len] int64."""
    ids: list[int] = []
    for conv in conversations:
        # transformers annotates one union for every mode of apply_chat_template (text, ids, a batch,
        # a BatchEncoding); one conversation with tokenize=True, return_dict=False gives its list[int].
        ids.extend(tokenizer.apply_chat_template(conv, tokenize=True, return_dict=False))  # type: ignore[arg-type]
    n_rows = max(1, len(ids) // seq_len)
    ids = (ids * math.ceil(n_rows * seq_len / max(1, len(ids))))[: n_rows * seq_len]
    return torch.tensor(ids, dtype=torch.long).view(n_rows, seq_len)


def train_causal_lm(
    model: LlamaForCausalLM,
    rows: torch.Tensor,
    *,
    steps: int,
    batch_size: int = 16,
    lr: float = 3e-3,
    seed: int = 0,
    device: str | torch.device = "cpu",
    time_budget_s: float | None = None,
    on_step: Callable[[int, float | None], None] | None = None,
) -> list[float]:
    """Train `model` on packed token rows [n, seq] with AdamW + cosine decay; return the losses.

    Stops early when `time_budget_s` is spent, so that a demo on a slow laptop still ends in
    time (the model is then simply less trained). `on_step(steps done, latest loss read)` is
    called after every step, for a progress display.
    """
    import time

    gen = random.Random(seed)
    # PreTrainedModel.to is wrapped with functools.wraps, which typeshed types as an unbound
    # callable (its first parameter, self, seen as the device); the call is the ordinary method call.
    model.to(device).train()  # type: ignore[arg-type]
    # The rows live where the model does: one gather per step instead of a host copy.
    rows = rows.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / max(1, steps // 20)) * 0.5 * (1 + math.cos(math.pi * s / steps))
    )
    use_bf16 = torch.device(device).type == "cuda"
    pad_id = model.config.pad_token_id
    losses: list[float] = []
    pending: list[torch.Tensor] = []
    # Every step's rows are drawn up front and sent once: a per-step host-to-device copy of the
    # indices would wait for the GPU each step.
    order = torch.tensor([[gen.randrange(rows.shape[0]) for _ in range(batch_size)] for _ in range(steps)],
                         device=rows.device)
    start = time.perf_counter()
    for step in range(steps):
        batch = rows[order[step]]
        # Padding is not text: keep it out of the loss (HF ignores label -100).
        labels = batch.masked_fill(batch == pad_id, -100) if pad_id is not None else batch
        with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16, enabled=use_bf16):
            loss = model(input_ids=batch, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        pending.append(loss.detach())
        over = time_budget_s is not None and time.perf_counter() - start > time_budget_s
        # Reading a loss waits for the GPU; a small model would idle between steps if read each step.
        if len(pending) == 25 or step == steps - 1 or over:
            losses.extend(torch.stack(pending).float().tolist())
            pending = []
        if on_step is not None:
            on_step(step + 1, losses[-1] if losses else None)
        if over:
            break
    model.eval()
    return losses
