"""`curator demo`: every stage of the pipeline, for real, on a tiny target made on the spot.

Each stage runs the same `curator ...` command a user would type (printed before it runs), in
this process, against files in one workdir. Nothing is mocked: the scout uses the rules
planner on the bundled snapshot of real Hub metadata, the mix is built from demo files in each
supported row format, the target is a small Llama trained here for a minute, and its answers,
hidden states, draft, export, checks and measured acceptance all come from the real code.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

from curator.catalog import Catalog
from curator.demo.corpus import (
    add_tool_tokens,
    demo_conversations,
    demo_texts,
    write_demo_sources,
    write_heldout_prompts,
)
from curator.demo.report import DemoReport, StageResult, summary_rows, write_html
from curator.errors import CuratorError
from curator.mix.schema import read_manifest
from curator.ui import console, summary_table
from training.toy_target import build_target, chat_token_batches, train_causal_lm


@dataclass
class DemoSettings:
    """Sizes of the demo; the defaults finish in a few minutes on 2 CPU cores."""

    rows_per_source: int = 48
    target_hidden: int = 128
    target_layers: int = 4
    target_vocab: int = 1024
    target_train_s: float = 45.0
    target_steps: int = 400
    gen_max_tokens: int = 64
    train_steps: int = 150
    train_batch: int = 16
    train_max_length: int = 512
    eval_prompts: int = 24
    eval_max_new_tokens: int = 48
    eval_steps: int = 3
    approve_top: int = 8
    seed: int = 0


def _cmd(argv: list[str]) -> str:
    return "curator " + " ".join(shlex.quote(a) for a in argv)


class Demo:
    """One demo run in a workdir; `run()` executes the stages in order and returns the report."""

    def __init__(self, workdir: str | Path, settings: DemoSettings | None = None) -> None:
        self.w = Path(workdir).resolve()
        self.s = settings or DemoSettings()
        self.report = DemoReport(workdir=self.w)
        self.catalog = self.w / "catalog.duckdb"

    # -- plumbing --------------------------------------------------------------------------

    def _cli(self, stage: str, argv: list[str], figures: Callable[[], dict[str, Any]], expect_fail: bool = False) -> None:
        """Run one `curator` command as a stage; record its figures and command."""
        from curator.cli import main

        command = _cmd(argv)
        console.rule(f"[bold]{stage}")
        console.print(f"[dim]$ {command}[/]", highlight=False)
        start = time.perf_counter()
        code = main(argv)
        seconds = time.perf_counter() - start
        if (code != 0) != expect_fail:
            raise CuratorError(f"demo stage {stage!r} {'passed' if expect_fail else 'failed'} unexpectedly (exit {code}): {command}")
        self.report.stages.append(StageResult(stage, seconds, figures(), command))

    def _step(self, stage: str, description: str, fn: Callable[[], dict[str, Any]]) -> None:
        """Run one stage that is demo set-up rather than a CLI command."""
        console.rule(f"[bold]{stage}")
        console.print(f"[dim]# {description}[/]", highlight=False)
        start = time.perf_counter()
        figures = fn()
        self.report.stages.append(StageResult(stage, time.perf_counter() - start, figures, f"(demo: {description})"))

    # -- stages ----------------------------------------------------------------------------

    def run(self) -> DemoReport:
        """Run every stage; return the report (also written to report.html and report.json)."""
        self.w.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(self.s.seed)
        self.scout()
        self.approve()
        self.build_mix()
        self.make_target()
        self.generate()
        self.plan()
        self.hidden_states()
        self.train()
        self.export()
        self.doctor()
        self.eval()
        self.finish()
        return self.report

    def scout(self) -> None:
        argv = ["scout", "--planner", "rules", "--hub", "bundled", "--agents", "10", "--no-live",
                "--catalog", str(self.catalog), "--recipe-out", str(self.w / "proposed-recipe.yaml")]

        def figures() -> dict[str, Any]:
            cat = Catalog.open(self.catalog)
            _, rows = cat.query("SELECT count(*), count(DISTINCT dataset_id) FROM candidates")
            return {"candidates": rows[0][0], "datasets": rows[0][1]}

        self._cli("scout", argv, figures)

    def approve(self) -> None:
        sql = (
            "UPDATE candidates SET status = 'approved' WHERE id IN (SELECT id FROM candidates "
            f"QUALIFY row_number() OVER (PARTITION BY dataset_id ORDER BY relevance DESC) = 1 "
            f"ORDER BY relevance DESC LIMIT {int(self.s.approve_top)})"
        )

        def figures() -> dict[str, Any]:
            return {"approved datasets": len(Catalog.open(self.catalog).approved_candidates())}

        self._cli("review", ["sql", sql, "--catalog", str(self.catalog)], figures)

    def build_mix(self) -> None:
        sources = write_demo_sources(self.w / "sources", seed=self.s.seed, rows_per_source=self.s.rows_per_source)
        # The approved datasets cannot be downloaded offline; the demo files stand in for them,
        # one per row format, so the same normalisers run as on the real data.
        categories = {"sharegpt": "chat", "messages": "chat", "alpaca": "debugging", "magicoder": "code",
                      "swe-agent": "agentic", "glaive": "agentic", "xlam": "agentic", "tools": "agentic", "openthoughts": "reasoning"}
        recipe = {
            "name": "demo-mix",
            "seed": self.s.seed,
            "sources": [
                {"path": str(path), "name": f"demo-{fmt}", "format": "auto", "samples": self.s.rows_per_source,
                 "category": categories[fmt]}
                for fmt, path in sources.items()
            ],
            "dedup": {"exact": True, "near": 0.9},
        }
        recipe_path = self.w / "demo-recipe.yaml"
        recipe_path.write_text("# DEMO recipe: local demo files stand in for the approved Hub datasets.\n" + yaml.safe_dump(recipe, sort_keys=False))

        def figures() -> dict[str, Any]:
            manifest = read_manifest(self.w / "mix")
            counts: dict[str, int] = {}
            for source in manifest["sources"]:
                counts[source["category"]] = counts.get(source["category"], 0) + source["kept"]
            self.report.mix_counts = counts
            total = manifest["total"]
            return {"prompts": total["kept"], "duplicates": total["duplicates"], "malformed": total["malformed"]}

        self._cli("build-mix", ["build-mix", "--recipe", str(recipe_path), "--out", str(self.w / "mix"),
                                "--catalog", str(self.catalog)], figures)

    def make_target(self) -> None:
        def fn() -> dict[str, Any]:
            model, tokenizer = build_target(
                demo_texts(self.s.seed), self.w / "target", vocab_size=self.s.target_vocab, seed=self.s.seed,
                hidden_size=self.s.target_hidden, num_layers=self.s.target_layers,
                num_heads=4, num_kv_heads=2, max_position_embeddings=2048,
            )
            add_tool_tokens(model, tokenizer)  # tool calls in the target's own special tokens
            rows = chat_token_batches(tokenizer, demo_conversations(self.s.seed), seq_len=256)
            losses = train_causal_lm(model, rows, steps=self.s.target_steps, batch_size=16, lr=3e-3,
                                     seed=self.s.seed, time_budget_s=self.s.target_train_s)
            from training.toy_target import save_target

            save_target(model, tokenizer, self.w / "target")
            return {"params": sum(p.numel() for p in model.parameters()), "vocab": len(tokenizer),
                    "train steps": len(losses), "loss": round(sum(losses[-10:]) / len(losses[-10:]), 3)}

        self._step("target", "train a BPE tokenizer and a small Llama on the demo text (not random: it learns the demo's structure)", fn)

    def generate(self) -> None:
        argv = ["generate", "--backend", "transformers", "--model", str(self.w / "target"), "--mix", str(self.w / "mix"),
                "--out", str(self.w / "gen"), "--temperature", "0", "--max-tokens", str(self.s.gen_max_tokens),
                "--batch-size", "64", "--catalog", str(self.catalog)]

        def figures() -> dict[str, Any]:
            meta = json.loads((self.w / "gen" / "generation.json").read_text())
            stats = meta.get("stats", meta)
            return {"samples": stats["done_total"], "errors": stats["errors_total"],
                    "output tokens": stats["completion_tokens"], "output tok/s": stats["output_tokens_per_s"]}

        self._cli("generate", argv, figures)

    def plan(self) -> None:
        argv = ["plan", "--model", str(self.w / "target"), "--data", str(self.w / "gen"), "--out", str(self.w)]
        self._cli("plan", argv, lambda: {})

    def hidden_states(self) -> None:
        argv = ["hidden-states", "--model", str(self.w / "target"), "--data", str(self.w / "gen"), "--out", str(self.w / "states")]

        def figures() -> dict[str, Any]:
            from training.store import HiddenStateStore

            store = HiddenStateStore.open(self.w / "states")
            return {"samples": len(store), "tokens": store.total_tokens(), "bytes": store.disk_bytes(),
                    "layers": store.meta.aux_layer_ids}

        self._cli("hidden-states", argv, figures)

    def train(self) -> None:
        config = {
            "data": str(self.w / "states"), "target": str(self.w / "target"), "out": str(self.w / "run"),
            "draft_vocab_size": 32000, "ttt_steps": 4, "lr": 3e-3, "warmup_ratio": 0.05,
            "global_batch_size": self.s.train_batch, "micro_batch_size": self.s.train_batch,
            "max_steps": self.s.train_steps, "max_length": self.s.train_max_length, "log_every": 10, "eval_every": 50, "eval_fraction": 0.1, "seed": self.s.seed,
            "device": "cpu",
        }
        config_path = self.w / "train.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))

        def figures() -> dict[str, Any]:
            metrics = self.w / "run" / "metrics.jsonl"
            self.report.train_log = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
            evals = [r for r in self.report.train_log if r.get("split") == "eval"]
            last = evals[-1] if evals else {}
            return {"steps": self.s.train_steps, "eval acc (step 0)": (last.get("acc") or [None])[0],
                    "eval accept length": last.get("accept_length"),
                    "eval simulated accept length": last.get("sim_accept_length")}

        self._cli("train", ["train", "--config", str(config_path), "--catalog", str(self.catalog)], figures)

    def export(self) -> None:
        argv = ["export", "--checkpoint", str(self.w / "run"), "--format", "sglang", "--out", str(self.w / "export")]
        self._cli("export", argv, lambda: {"files": sorted(p.name for p in (self.w / "export").iterdir())})

    def _launch(self, algorithm: str) -> str:
        return (f"python -m sglang.launch_server --model {self.w / 'target'} --speculative-algorithm {algorithm} "
                f"--speculative-draft-model-path {self.w / 'export'} --speculative-num-steps 3 "
                f"--speculative-eagle-topk 1 --speculative-num-draft-tokens 4")

    def doctor(self) -> None:
        base = ["doctor", "--draft", str(self.w / "export"), "--model", str(self.w / "target"), "--data", str(self.w / "states")]
        self._cli("doctor", [*base, "--launch", self._launch("EAGLE3")], lambda: {"launch EAGLE3": "ok"})
        # The original case's costly mistake: the doctor must refuse it.
        self._cli("doctor (EAGLE)", [*base, "--launch", self._launch("EAGLE")], lambda: {"launch EAGLE": "refused"}, expect_fail=True)

    def eval(self) -> None:
        prompts = write_heldout_prompts(self.w / "heldout.jsonl", n=self.s.eval_prompts)
        out = self.w / "eval.json"
        argv = ["eval", "--model", str(self.w / "target"), "--draft", str(self.w / "export"), "--prompts", str(prompts),
                "--steps", str(self.s.eval_steps), "--max-new-tokens", str(self.s.eval_max_new_tokens),
                "--data", str(self.w / "states"), "--device", "cpu", "--json", str(out)]

        def figures() -> dict[str, Any]:
            data = json.loads(out.read_text())
            self.report.acceptance_length = data["acceptance_length"]
            self.report.acceptance_measured = [r["rate"] for r in data["overall"]["per_position"]]
            agentic = (data.get("categories") or {}).get("agentic") or {}
            self.report.acceptance_agentic = agentic.get("acceptance_length")
            simulated = (data.get("offline_estimate") or {}).get("simulated") or {}
            if simulated.get("acceptance_length") is not None:
                self.report.acceptance_length_estimated = float(simulated["acceptance_length"])
            self.report.acceptance_estimated = [float(r["rate"]) for r in simulated["overall"]["per_position"]
                                                if r["rate"] is not None] if simulated else []
            return {"prompts": data["prompts_decoded"], "acceptance length": self.report.acceptance_length,
                    "agentic": self.report.acceptance_agentic, "estimated": self.report.acceptance_length_estimated}

        self._cli("eval", argv, figures)

    def finish(self) -> None:
        html_path = write_html(self.report, self.w / "report.html")
        (self.w / "report.json").write_text(json.dumps(
            {"stages": [s.__dict__ for s in self.report.stages], "mix": self.report.mix_counts,
             "acceptance_length": self.report.acceptance_length,
             "acceptance_length_estimated": self.report.acceptance_length_estimated,
             "acceptance_length_agentic": self.report.acceptance_agentic}, indent=1, default=str))
        console.rule("[bold]report")
        console.print(summary_table("curator demo", summary_rows(self.report)))
        console.print(f"open [bold]{html_path}[/] in a browser for the plots")


def run_demo(workdir: str | Path, settings: DemoSettings | None = None) -> DemoReport:
    """Run the whole demo in `workdir`; return its report."""
    return Demo(workdir, settings).run()
