"""Acceptance of an SGLang export drafted through SGLang's own module, beside `curator eval`'s.

Run in the engines' environment (.ci/engines.sh), e.g. on the demo's outputs:
    PYTHONPATH=$PWD /tmp/curator-engines-venv/bin/python tests/engines/sglang_acceptance.py \\
        --model DEMO/target --draft DEMO/export-sglang --prompts DEMO/mix --limit 6 --max-new-tokens 24
It prints the acceptance length of the same prompts with SGLang's LlamaForCausalLMEagle3 (its
load_weights, fed the layers its set_eagle3_layers_to_capture picks for the target) and with the
toolkit's draft (what `curator eval` runs).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from sglang_cpu import SGLangDraft, SGLangProposer, captured_by_model_loop, config_layer_ids, sglang_layers_to_capture  # noqa: E402


def main() -> None:
    from curator.mix.prompts import mix_prompts
    from training.eval.evaluate import evaluate, load_target
    from training.eval.prompts import load_prompt_file, spread_by_category
    from training.eagle3.proposer import DraftProposer
    from training.eagle3.load import load_draft
    from training.target.head import load_embeddings

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--draft", type=Path, required=True)
    parser.add_argument("--prompts", type=Path, required=True)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    args = parser.parse_args()
    prompts, _ = mix_prompts(args.prompts) if args.prompts.is_dir() else load_prompt_file(args.prompts)
    prompts = spread_by_category(prompts, args.limit)
    target, tokenizer = load_target(args.model)
    n, arch = int(target.config.num_hidden_layers), target.config.architectures[0]
    captured = captured_by_model_loop(sglang_layers_to_capture(arch, n, config_layer_ids(args.draft)), arch, n)
    kw = dict(steps=args.steps, topk=1, max_new_tokens=args.max_new_tokens)
    sg = evaluate(target, tokenizer, SGLangProposer(SGLangDraft(args.draft, load_embeddings(args.model)), captured), prompts, **kw)
    ours = evaluate(target, tokenizer, DraftProposer(load_draft(args.draft, args.model)), prompts, **kw)
    print(f"SGLang captures the inputs of layers {captured} ({arch}, {n} layers)")
    print(f"acceptance length, SGLang's module: {sg.overall.acceptance_length:.4f}")
    print(f"acceptance length, toolkit draft:   {ours.overall.acceptance_length:.4f}")


if __name__ == "__main__":
    main()
