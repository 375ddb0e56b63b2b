"""EAGLE-3.1's normalisations measured on the demo: the same data, steps and settings, one draft per variant.

    python -m bench.eagle31_variants --workdir /tmp/e31-demo --quick --out bench/results/eagle31-demo-quick.json

1. `curator demo` (--quick: its quick settings) runs once in WORKDIR (taken up when it has finished there);
2. for each variant, the demo's own train config (WORKDIR/train.yaml) with the variant's norm options, trained
   into WORKDIR/variants/NAME/run, exported (SGLang layout; the speculators one for norm_before_residual,
   which SGLang does not build), and measured as the demo's eval stage measures it (`curator eval`'s
   speculative decoding on the traffic's held-out conversations, weighted by the profile, the offline
   estimate beside it).

The "plain" variant is the demo's own draft trained again: its figures must equal the demo's (the run is
deterministic on one thread), which the JSON records as `plain_equals_demo`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# name: the norm options (training.train.config.TrainConfig) that make it
VARIANTS: dict[str, dict[str, bool]] = {
    "plain": {},
    "norm_before_fc": {"norm_before_fc": True},
    "fc_norm": {"fc_norm": True},
    "norm_output": {"norm_output": True},
    "norm_before_residual": {"norm_before_residual": True},
    # speculators 0.9.0's eagle3 training defaults (train/config/schema.py): its "EAGLE-3.1"
    "eagle3.1": {"norm_before_fc": True, "norm_output": True, "norm_before_residual": True},
}


def measure_variant(w: Path, name: str, options: dict[str, bool], settings: Any) -> dict[str, Any]:
    """Train, export and evaluate one variant on the demo's data; return its figures."""
    import yaml

    from curator.commands.evaluate import measure
    from curator.evaluation.weighting import eval_weights
    from curator.mix.prompts import mix_prompts
    from training.eval.evaluate import load_target
    from training.eval.prompts import held_out_split
    from training.export.export import export_checkpoint
    from training.eagle3.load import load_draft
    from training.train.config import TrainConfig
    from training.train.trainer import train

    base = yaml.safe_load((w / "train.yaml").read_text())
    out = w / "variants" / name
    cfg = TrainConfig.from_dict({**base, **options, "out": str(out / "run")})
    t0 = time.perf_counter()
    result = train(cfg)
    train_s = time.perf_counter() - t0
    fmt = "speculators" if options.get("norm_before_residual") else "sglang"
    export = export_checkpoint(out / "run", out / "export", fmt=fmt, verifier="demo/target")
    prompts = w / "mix" / ".heldout"
    chosen, _ = mix_prompts(prompts)
    target, tokenizer = load_target(w / "target", "cpu")
    drafter = load_draft(export, w / "target")
    figures = measure(target, tokenizer, drafter, chosen, steps=settings.eval_steps,
                      max_new_tokens=settings.eval_max_new_tokens, tie_margin=1e-4, weights=eval_weights(w / "profile.json", prompts),
                      offline=(w / "states", w / "target", held_out_split(export))).to_json()
    simulated = (figures.get("offline_estimate") or {}).get("simulated") or {}
    return {
        "options": options, "export_format": fmt, "train_steps": result.step, "train_s": round(train_s, 1),
        "acceptance_length": figures["acceptance_length"],
        "traffic_weighted": (figures.get("traffic_weighted") or {}).get("acceptance_length"),
        "agentic": ((figures.get("categories") or {}).get("agentic") or {}).get("acceptance_length"),
        "per_position": [r["rate"] for r in figures["overall"]["per_position"]],
        "simulated": simulated.get("acceptance_length"),
        "trainer_eval": {k: result.eval.get(k) for k in ("accept_length", "sim_accept_length", "acc", "loss")},
        "eval": figures,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", required=True)
    p.add_argument("--quick", action="store_true", help="the demo's quick settings (curator demo --quick)")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--out", required=True, help="the results JSON (rewritten after every variant)")
    args = p.parse_args(argv)
    names = [n for n in args.variants.split(",") if n]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        p.error(f"unknown variants {unknown}; choose of {list(VARIANTS)}")

    from curator.demo.pipeline import DEMO_THREADS, QUICK, DemoSettings, run_demo
    from training.io.atomic import write_json

    settings = QUICK if args.quick else DemoSettings()
    w = Path(args.workdir)
    report = run_demo(w, settings)  # sets the demo's one thread, as `curator demo` runs
    demo = json.loads((w / "eval.json").read_text())
    results: dict[str, Any] = {
        "command": "python -m bench.eagle31_variants " + " ".join(argv if argv is not None else sys.argv[1:]),
        "demo": {"quick": args.quick, "torch_threads": DEMO_THREADS, "acceptance_length": report.acceptance_length,
                 "traffic_weighted": report.acceptance_traffic, "simulated": report.acceptance_length_estimated},
        "variants": {},
    }
    for name in names:
        row = measure_variant(w, name, VARIANTS[name], settings)
        results["variants"][name] = row
        if name == "plain":
            results["plain_equals_demo"] = row["acceptance_length"] == demo["acceptance_length"]
        print(json.dumps({name: {k: v for k, v in row.items() if k != "eval"}}), flush=True)
        write_json(args.out, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
