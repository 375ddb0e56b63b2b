"""The prompt set of a serving benchmark: a mix's held-out rows (by the draft's recorded split) or a
JSONL/text prompt file, each prompt with its category."""

from __future__ import annotations

from pathlib import Path

from curator.errors import ConfigError
from curator.serve_bench.run import BenchPrompt


def held_out_rows(ids: list[str], draft_dir: Path) -> tuple[set[str], str]:
    """Return the row ids the draft never trained on, by the split its checkpoint recorded, and how."""
    from training.feed.batches import split_eval
    from training.eval.prompts import held_out_split
    from training.storage.reader import HiddenStateStore

    split = held_out_split(draft_dir)
    if split.eval_store:
        held = set(HiddenStateStore.open(split.eval_store).ids()) & set(ids)
        return held, f"rows captured in the run's held-out store {split.eval_store}"
    return set(split_eval(ids, split.eval_fraction)[1]), f"held-out rows (eval_fraction {split.eval_fraction}, from the checkpoint)"


def load_bench_prompts(path: Path, *, draft_dir: Path | None = None, tokenizer_dir: Path | None = None,
                       limit: int | None = None) -> tuple[list[BenchPrompt], str]:
    """Return the prompts to send and a line saying where they come from.

    A mix directory gives its held-out rows when `draft_dir` (the export) names the checkpoint's
    split, else every row, labelled as possibly trained on. With `tokenizer_dir` each prompt is also
    rendered to token ids with the target's chat template (SGLang's /generate takes ids).
    """
    from training.eval.prompts import load_prompt_file, spread_by_category

    if path.is_dir():
        from curator.mix.prompts import mix_prompts

        prompts, _ = mix_prompts(path)
        if draft_dir is not None:
            keep, source = held_out_rows([p.id for p in prompts], draft_dir)
            prompts = [p for p in prompts if p.id in keep]
            source = f"{path}: {source}"
        else:
            source = f"{path}: every row (not checked against a training split: pass --draft to keep the held-out rows)"
    else:
        prompts, _ = load_prompt_file(path)
        source = str(path)
    prompts = spread_by_category(prompts, limit)
    if not prompts:
        raise ConfigError(f"no prompts to send from {path}")
    render = None
    if tokenizer_dir is not None:
        from transformers import AutoTokenizer

        from training.eval.prompts import render_prompt

        if not (tokenizer_dir / "tokenizer_config.json").is_file() and not (tokenizer_dir / "tokenizer.json").is_file():
            raise ConfigError(f"{tokenizer_dir} holds no tokenizer: pass the target's local model directory")
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        render = lambda messages: render_prompt(tokenizer, messages)
    return [BenchPrompt(p.id, p.category or "all", p.messages, render(p.messages) if render else None)
            for p in prompts], source
