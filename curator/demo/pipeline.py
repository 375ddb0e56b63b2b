"""`curator demo`: every stage of the pipeline, for real, on a tiny target made on the spot.

Each stage calls the same library functions as its `curator ...` command (the command is
printed before the stage runs, so a user can repeat it), against files in one workdir. Nothing
is mocked: the scout uses the rules planner on the bundled snapshot of real Hub metadata, the
mix is built from demo files in each supported row format, the target is a small Llama trained
here for a fixed number of steps, and its answers, hidden states, draft, export, checks and
measured acceptance all come from the real code.

What the demo learns does not depend on how busy the machine is: every stage runs a fixed
amount of work from fixed seeds. A run records each finished stage in `demo-state.json`; a
second run in the same workdir skips those and redoes only the rest (so the catalog never gets
a stage's rows twice), and `--fresh` removes what the demo made and starts over.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import shutil
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from rich.markup import escape
from rich.progress import TextColumn

from curator.catalog import Catalog
from curator.cpu import set_torch_threads
from curator.demo.corpus import (
    add_tool_tokens,
    demo_conversations,
    demo_texts,
    write_demo_sources,
    write_demo_traffic,
)
from curator.demo.report import DemoReport, StageResult, summary_rows, write_html
from curator.errors import ConfigError, CuratorError
from curator.stages import Recorded, build_and_record_mix, generate_and_record, train_and_record
from curator.ui import console, progress, quiet_library_progress, summary_table
from training.io.atomic import write_json

T = TypeVar("T")
STATE_FILE = "demo-state.json"
# What each stage writes in the workdir (glob patterns): removed before the stage (re)runs, and by --fresh.
OUTPUTS = {
    "scout": ("catalog.duckdb*", "proposed-recipe.yaml"),  # the catalog and the files kept beside it
    "profile": ("traffic.jsonl", "profile.json"),
    "build-mix": ("sources", "mix", "demo-recipe.yaml"),
    "target": ("target",),
    "generate": ("gen",),
    "hidden-states": ("states",),
    "train": ("run", "train.yaml"),
    "export": ("export",),
    "eval": ("eval.json",),
    "serve (vLLM)": ("vllm-serve.log",),
    "report": ("report.html", "report.json", STATE_FILE),
}
# The demo's models are a few hundred thousand parameters: each op is too small to share out, and
# a second thread only waits for a core (on a busy 2-core machine one target step took 3.0-3.8 s
# on 2 threads, 0.5-1.4 s on 1). One thread also fixes the order of every float sum, so a run
# repeats its figures to the digit under the same packages (constraints.txt) and CPU kernels.
DEMO_THREADS = 1
# A regenerated answer whose most common token is at least this share of it is one token repeated.
REPEATED_TOKEN_SHARE = 0.5


@dataclass
class DemoSettings:
    """Sizes of the demo; the defaults finish in about 3.5 minutes on one free CPU core."""

    rows_per_source: int = 48
    traffic_requests: int = 120
    target_hidden: int = 128
    target_layers: int = 4
    target_vocab: int = 1024
    target_steps: int = 200
    gen_max_tokens: int = 64
    train_steps: int = 150
    train_batch: int = 16
    train_max_length: int = 512
    eval_prompts: int = 24
    eval_max_new_tokens: int = 48
    eval_steps: int = 3
    approve_top: int = 8
    seed: int = 0


QUICK = DemoSettings(rows_per_source=16, traffic_requests=48, target_steps=80, gen_max_tokens=32, train_steps=20, train_batch=4,
                     train_max_length=192, eval_prompts=6, eval_max_new_tokens=24)


def curator_line(argv: list[str]) -> str:
    """Return `argv` as a `curator ...` line a POSIX shell reads back as the same arguments."""
    return "curator " + " ".join(shell_word(a) for a in argv)


def shell_word(arg: str) -> str:
    """Return `arg` quoted for a POSIX shell as a person would write it: SQL with quotes inside
    goes in double quotes (shlex.quote would splice in '"'"' for every single quote)."""
    quoted = shlex.quote(arg)
    if quoted != arg and "'" in arg and not any(c in arg for c in '"$`\\!'):
        return f'"{arg}"'
    return quoted


def repeated_token_share(token_ids: list[int]) -> float:
    """Return the share of `token_ids` taken by its most common token (0 for an empty answer)."""
    if not token_ids:
        return 0.0
    return Counter(token_ids).most_common(1)[0][1] / len(token_ids)


class Demo:
    """One demo run in a workdir; `run()` executes the stages in order and returns the report."""

    GEN_BATCH = 64  # rows a transformers batch generates at once

    def __init__(self, workdir: str | Path, settings: DemoSettings | None = None, fresh: bool = False,
                 serve_python: str | None = None) -> None:
        self.w = Path(workdir).resolve()
        self.s = settings or DemoSettings()
        self.fresh = fresh
        self.serve_python = serve_python  # vLLM's python: the last stage serves the draft there
        self.report = DemoReport(workdir=self.w)
        self.catalog = self.w / "catalog.duckdb"
        self.done: dict[str, dict[str, Any]] = {}  # stage -> its StageResult, from demo-state.json

    # -- state -----------------------------------------------------------------------------

    def _load_state(self) -> None:
        """Remove the old run's outputs (--fresh), or take up the stages it finished."""
        state_path = self.w / STATE_FILE
        if self.fresh:
            for names in OUTPUTS.values():
                self._remove(names)
            return
        if not state_path.exists():
            return
        state = json.loads(state_path.read_text(encoding="utf-8"))
        if state.get("settings") != asdict(self.s):
            raise ConfigError(f"{self.w} holds a demo run made with other settings (--quick or not); "
                              "pass --fresh to start over there, or choose another --workdir")
        self.done = {s["name"]: s for s in state.get("stages", [])}
        for key, value in state.get("report", {}).items():
            setattr(self.report, key, value)

    def _save_state(self) -> None:
        r = self.report
        write_json(self.w / STATE_FILE, {
            "settings": asdict(self.s),
            "stages": [asdict(s) for s in r.stages],
            "report": {"mix_counts": r.mix_counts, "train_log": r.train_log, "warnings": r.warnings,
                       "acceptance_measured": r.acceptance_measured, "acceptance_estimated": r.acceptance_estimated,
                       "acceptance_length": r.acceptance_length,
                       "acceptance_length_estimated": r.acceptance_length_estimated,
                       "acceptance_agentic": r.acceptance_agentic, "acceptance_traffic": r.acceptance_traffic,
                       "traffic_shares": r.traffic_shares, "eval_steps": r.eval_steps},
        }, indent=1, default=str)

    def _remove(self, patterns: tuple[str, ...]) -> None:
        for pattern in patterns:
            for path in self.w.glob(pattern):
                if path.is_dir() and not path.is_symlink():  # a link (the real mode's cached target) goes, not what it names
                    shutil.rmtree(path)
                else:
                    path.unlink(missing_ok=True)

    # -- plumbing --------------------------------------------------------------------------

    def _stage(self, stage: str, command: str, fn: Callable[[], dict[str, Any]]) -> None:
        """Run one stage (or take its figures from the earlier run that finished it); record them."""
        console.rule(f"[bold]{stage}")
        console.print(f"[dim]$ {command}[/]" if command.startswith("curator ") else f"[dim]# {command}[/]",
                      highlight=False)
        if stage in self.done:
            self.report.stages.append(StageResult(**self.done[stage]))
            console.print("[dim]done by an earlier run in this workdir (--fresh starts over)[/]")
            return
        self._remove(OUTPUTS.get(stage, ()))
        start = time.perf_counter()
        import torch

        threads = torch.get_num_threads()
        set_torch_threads(DEMO_THREADS)
        try:
            figures = fn()
        finally:
            set_torch_threads(threads)  # a caller's own torch work keeps its threads
        self.report.stages.append(StageResult(stage, time.perf_counter() - start, figures, command))
        if figures:
            console.print(summary_table(stage, list(figures.items())))
        self._save_state()

    def _recorded(self, recorded: Recorded[T]) -> T:
        """Return a finished stage's result; a catalog failure after it is a warning in the report,
        as the stage's command prints it: the stage's files are complete and the demo goes on."""
        if recorded.warning:
            self.warn(recorded.warning)
        return recorded.result

    def warn(self, message: str) -> None:
        """Print a warning now and keep it for the report."""
        console.print(f"[bold yellow]warning:[/] {escape(message)}", highlight=False)  # messages quote data
        self.report.warnings.append(message)

    # -- stages ----------------------------------------------------------------------------

    def run(self) -> DemoReport:
        """Run every stage; return the report (also written to report.html and report.json)."""
        self.w.mkdir(parents=True, exist_ok=True)
        self._load_state()
        quiet_library_progress()
        console.print(f"[dim]torch uses {DEMO_THREADS} thread: the demo's models are too small to gain from more, "
                      "and one thread makes its figures repeat run after run[/]", highlight=False)
        return self.run_stages()

    def stages(self) -> list[Callable[[], None]]:
        """The stages in order (a mode adds its own: the real demo's prompt packages)."""
        return [self.scout, self.approve, self.profile, self.build_mix, self.make_target, self.generate, self.plan,
                self.hidden_states, self.train, self.export, self.doctor, self.eval,
                *([self.serve] if self.serve_python else [])]

    def run_stages(self) -> DemoReport:
        for stage in self.stages():
            stage()
        self.finish()
        return self.report

    def scout(self) -> None:
        from curator.hub import open_hub
        from curator.scout.briefs import categories, load_briefs, take
        from curator.scout.orchestrator import ScoutConfig, ScoutRun
        from curator.scout.proposal import merge_candidates, propose_mix, write_proposal

        recipe_out = self.w / "proposed-recipe.yaml"
        argv = ["scout", "--planner", "rules", "--hub", "bundled", "--agents", "10", "--no-live",
                "--catalog", str(self.catalog), "--recipe-out", str(recipe_out)]

        def fn() -> dict[str, Any]:
            briefs = load_briefs(None)
            hub = open_hub("bundled")
            cat = Catalog.open(self.catalog)
            config = ScoutConfig(planner="rules", live=False)
            run = ScoutRun(cat, hub, take(briefs, 10), config, None, sorted(categories(briefs)))

            async def go() -> None:
                try:
                    await run.run()
                finally:
                    await hub.aclose()

            asyncio.run(go())
            write_proposal(propose_mix(merge_candidates(cat, run.run_id), briefs, config.goal, config.target_samples,
                                       run_id=run.run_id), recipe_out)
            _, rows = cat.query("SELECT count(*), count(DISTINCT dataset_id) FROM candidates")
            return {"candidates": rows[0][0], "datasets": rows[0][1]}

        self._stage("scout", curator_line(argv), fn)

    def approve(self) -> None:
        from curator.sql import run_sql

        sql = (
            "UPDATE candidates SET status = 'approved' WHERE id IN (SELECT id FROM candidates "
            f"QUALIFY row_number() OVER (PARTITION BY dataset_id ORDER BY relevance DESC) = 1 "
            f"ORDER BY relevance DESC LIMIT {int(self.s.approve_top)})"
        )

        def fn() -> dict[str, Any]:
            run_sql(sql, self.catalog)
            return {"approved datasets": len(Catalog.open(self.catalog).approved_candidates())}

        self._stage("review", curator_line(["sql", sql, "--catalog", str(self.catalog)]), fn)

    def profile(self) -> None:
        from curator.traffic.profile import build_profile, write_profile

        traffic, out = self.w / "traffic.jsonl", self.w / "profile.json"

        def fn() -> dict[str, Any]:
            # The deployment's request log stands in as a file of templates (a known mix of coding and agentic requests).
            write_demo_traffic(traffic, n=self.s.traffic_requests)
            profile = build_profile(traffic)
            write_profile(profile, out)
            self.report.traffic_shares = {name: c.share for name, c in profile.categories.items() if c.share}
            return {"requests": sum(c.rows for c in profile.categories.values()),
                    **{name: f"{c.share:.0%}" for name, c in profile.categories.items() if c.share}}

        self._stage("profile", curator_line(["profile", "--traffic", str(traffic), "--out", str(out)]), fn)

    def build_mix(self) -> None:
        from curator.mix.recipe import load_recipe

        recipe_path = self.w / "demo-recipe.yaml"
        mix_dir = self.w / "mix"
        profile = self.w / "profile.json"

        def fn() -> dict[str, Any]:
            sources = write_demo_sources(self.w / "sources", seed=self.s.seed, rows_per_source=self.s.rows_per_source)
            # The approved datasets cannot be downloaded offline; the demo files stand in for them,
            # one per row format, so the same normalisers run as on the real data.
            # Named by the traffic's categories, so that --match can give each its share of the traffic.
            categories = {"sharegpt": "chat", "messages": "chat", "alpaca": "code", "magicoder": "code",
                          "swe-agent": "agentic", "glaive": "agentic", "xlam": "agentic", "tools": "agentic",
                          "openthoughts": "reasoning"}
            recipe = {
                "name": "demo-mix",
                "seed": self.s.seed,
                "sources": [
                    {"path": str(path), "name": f"demo-{fmt}", "format": "auto", "samples": self.s.rows_per_source,
                     "category": categories[fmt]}
                    for fmt, path in sources.items()
                ] + [
                    # the traffic itself: its prompts are regenerated like any other, and a held-out
                    # split of its conversations (mix/.heldout) is what acceptance is measured on
                    {"path": str(self.w / "traffic.jsonl"), "name": "demo-traffic", "format": "traffic",
                     "samples": self.s.rows_per_source, "heldout": self.s.eval_prompts},
                ],
                "dedup": {"exact": True, "near": 0.9},
            }
            recipe_path.write_text("# DEMO recipe: local demo files stand in for the approved Hub datasets.\n"
                                   + yaml.safe_dump(recipe, sort_keys=False))
            mix_recipe = load_recipe(recipe_path)
            manifest = self._recorded(build_and_record_mix(mix_recipe, mix_dir, self.catalog, match=profile))
            counts: dict[str, int] = {}
            for source in manifest["sources"]:  # a traffic source's rows are classified one by one
                for category, got in (source.get("categories") or {source["category"]: {"kept": source["kept"]}}).items():
                    counts[category] = counts.get(category, 0) + got["kept"]
            self.report.mix_counts = counts
            total = manifest["total"]
            return {"prompts": total["kept"], "duplicates": total["duplicates"], "malformed": total["malformed"],
                    "held-out traffic": (manifest.get("heldout") or {}).get("rows", 0)}

        self._stage("build-mix", curator_line(["build-mix", "--recipe", str(recipe_path), "--match", str(profile),
                                       "--out", str(mix_dir), "--catalog", str(self.catalog)]), fn)

    def make_target(self) -> None:
        def fn() -> dict[str, Any]:
            from training.target.toy import build_target, chat_token_batches, save_target, train_causal_lm

            model, tokenizer = build_target(
                demo_texts(self.s.seed), self.w / "target", vocab_size=self.s.target_vocab, seed=self.s.seed,
                hidden_size=self.s.target_hidden, num_layers=self.s.target_layers,
                num_heads=4, num_kv_heads=2, max_position_embeddings=2048,
            )
            add_tool_tokens(model, tokenizer)  # tool calls in the target's own special tokens
            rows = chat_token_batches(tokenizer, demo_conversations(self.s.seed), seq_len=256)
            bar = progress(TextColumn("{task.fields[loss]}"))
            task = bar.add_task("target", total=self.s.target_steps, loss="")

            def show(step: int, loss: float | None) -> None:
                bar.update(task, completed=step, loss="" if loss is None else f"loss {loss:.3f}")

            with bar:
                losses = train_causal_lm(model, rows, steps=self.s.target_steps, batch_size=16, lr=3e-3,
                                         seed=self.s.seed, on_step=show)
            save_target(model, tokenizer, self.w / "target")
            first, last = sum(losses[:10]) / len(losses[:10]), sum(losses[-10:]) / len(losses[-10:])
            if last > 0.7 * first:
                self.warn(f"the target's loss only went from {first:.2f} to {last:.2f} in {len(losses)} steps: "
                          "it has learned little, and the draft will only learn to copy its mistakes")
            return {"params": sum(p.numel() for p in model.parameters()), "vocab": len(tokenizer),
                    "train steps": f"{len(losses)} of {self.s.target_steps}", "loss": round(last, 3)}

        self._stage("target", "train a BPE tokenizer and a small Llama on the demo text for a fixed number of "
                              "steps (not random: it learns the demo's structure)", fn)

    def generate(self) -> None:
        from curator.generate.run import GenerateConfig

        out = self.w / "gen"
        config = GenerateConfig(mix=self.w / "mix", out=out, model=str(self.w / "target"), backend="transformers",
                                temperature=0.0, max_tokens=self.s.gen_max_tokens, batch_size=self.GEN_BATCH,
                                seed=self.s.seed)
        argv = ["generate", "--backend", "transformers", "--model", config.model, "--mix", str(config.mix),
                "--out", str(out), "--temperature", "0", "--max-tokens", str(self.s.gen_max_tokens),
                "--batch-size", str(self.GEN_BATCH), "--catalog", str(self.catalog)]

        def fn() -> dict[str, Any]:
            from curator.generate.progress import LiveProgress

            bar = progress(TextColumn("{task.fields[info]}"))
            with bar:
                recorded = generate_and_record(config, self.catalog, on_progress=LiveProgress(bar))
            stats = self._recorded(recorded)  # the warning, if any, after the progress bar
            repeated = self._check_answers(out)
            return {"samples": stats.done_total, "errors": stats.errors_total, "output tokens": stats.completion_tokens,
                    "output tok/s": stats.output_tokens_per_s, "answers one token repeated": repeated,
                    "tool calls written": self._check_tool_calls(out)}

        self._stage("generate", curator_line(argv), fn)

    def _check_answers(self, gen_dir: Path) -> str:
        """Warn when most regenerated answers are one token repeated; return "n of N"."""
        from transformers import AutoTokenizer

        from training.records.chat_tokens import iter_generation

        tokenizer = AutoTokenizer.from_pretrained(self.w / "target")
        answers = [m.get("content") or "" for rec in iter_generation(gen_dir) for m in rec["messages"]
                   if m.get("role") == "assistant"]
        repeated = sum(repeated_token_share(tokenizer.encode(a, add_special_tokens=False)) >= REPEATED_TOKEN_SHARE
                       for a in answers)
        if answers and repeated > len(answers) / 2:
            self.warn(f"{repeated} of {len(answers)} regenerated answers are mostly one token repeated: the target "
                      "learned little, so the draft's acceptance will only measure how well it predicts that token")
        return f"{repeated} of {len(answers)}"

    def _check_tool_calls(self, gen_dir: Path) -> str:
        """Return "n of N": regenerated answers to prompts that declare tools which are tool calls.

        The target writes a call between its own `<tool_call>` tokens and generate parses it into
        structured `tool_calls`; a count of 0 means the agentic acceptance measures plain text.
        """
        from training.records.chat_tokens import iter_generation

        answers = [m for rec in iter_generation(gen_dir) if rec.get("tools") for m in rec["messages"]
                   if m.get("role") == "assistant" and m.get("train")]
        calls = sum(bool(m.get("tool_calls")) for m in answers)
        if answers and not calls:
            self.warn(f"none of the {len(answers)} regenerated answers to prompts with tools is a tool call: the "
                      "target never learned to call its tools, so the agentic acceptance measures plain text")
        return f"{calls} of {len(answers)}"

    def plan(self) -> None:
        argv = ["plan", "--model", str(self.w / "target"), "--data", str(self.w / "gen"), "--out", str(self.w)]

        def fn() -> dict[str, Any]:
            from training.records.chat_tokens import iter_generation
            from training.capture.plan import data_lengths, load_shape, make_plan
            from transformers import AutoTokenizer

            lengths, how, _ = data_lengths(iter_generation(self.w / "gen"),
                                           AutoTokenizer.from_pretrained(self.w / "target"))
            plan = make_plan(load_shape(str(self.w / "target")), lengths=lengths, dtype="bf16", out_dir=self.w,
                             lengths_from=how)
            return {"samples": plan.samples, "bytes/token (store)": plan.store_bytes_per_token,
                    "store bytes": plan.chosen.store_bytes}

        self._stage("plan", curator_line(argv), fn)

    def hidden_states(self) -> None:
        argv = ["hidden-states", "--model", str(self.w / "target"), "--data", str(self.w / "gen"),
                "--out", str(self.w / "states")]

        def fn() -> dict[str, Any]:
            from curator.hidden.capture import CaptureSettings, capture_hidden_states
            from training.storage.reader import HiddenStateStore

            capture_hidden_states(CaptureSettings(model=str(self.w / "target"), data=self.w / "gen",
                                                  out=self.w / "states"))
            store = HiddenStateStore.open(self.w / "states")
            return {"samples": len(store), "tokens": store.total_tokens(), "bytes": store.disk_bytes(),
                    "layers": store.meta.aux_layer_ids}

        self._stage("hidden-states", curator_line(argv), fn)

    def train_config(self) -> dict[str, Any]:
        """Return the draft's training config (train.yaml)."""
        return {
            "data": str(self.w / "states"), "target": str(self.w / "target"), "out": str(self.w / "run"),
            "draft_vocab_size": 32000, "ttt_steps": 4, "lr": 3e-3, "warmup_ratio": 0.05,
            "global_batch_size": self.s.train_batch, "micro_batch_size": self.s.train_batch,
            "max_steps": self.s.train_steps, "max_length": self.s.train_max_length, "log_every": 10,
            "eval_every": 50, "eval_fraction": 0.1, "seed": self.s.seed, "device": "cpu",
        }

    def train(self) -> None:
        config = self.train_config()
        config_path = self.w / "train.yaml"

        def fn() -> dict[str, Any]:
            from curator.train_progress import accept_length_rows, training_progress
            from training.train.config import load_run_config

            config_path.write_text(yaml.safe_dump(config, sort_keys=False))
            cfg = load_run_config(config_path)
            bar, show = training_progress()
            with bar:
                recorded = train_and_record(cfg, self.catalog, on_metrics=show)
            result = self._recorded(recorded)  # the warning, if any, after the progress bar
            metrics = self.w / "run" / "metrics.jsonl"
            self.report.train_log = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
            last = result.eval or {}
            # the final eval's accuracy on the first drafted token (TTT step 0), not a figure of training step 0
            return {"steps": f"{result.step} of {self.s.train_steps}",
                    "eval acc, draft position 1": (last.get("acc") or [None])[0], **accept_length_rows(last, "eval")}

        self._stage("train", curator_line(["train", "--config", str(config_path), "--catalog", str(self.catalog)]), fn)

    def export(self) -> None:
        argv = ["export", "--checkpoint", str(self.w / "run"), "--format", "sglang", "--out", str(self.w / "export")]

        def fn() -> dict[str, Any]:
            from training.export.export import export_checkpoint

            path = export_checkpoint(self.w / "run", self.w / "export", fmt="sglang")
            return {"files": ", ".join(sorted(p.name for p in path.iterdir()))}

        self._stage("export", curator_line(argv), fn)

    def _launch(self, algorithm: str) -> str:
        return (f"python -m sglang.launch_server --model {self.w / 'target'} --speculative-algorithm {algorithm} "
                f"--speculative-draft-model-path {self.w / 'export'} --speculative-num-steps 3 "
                f"--speculative-eagle-topk 1 --speculative-num-draft-tokens 4")

    def doctor(self) -> None:
        from curator.doctor import diagnose

        base = ["doctor", "--draft", str(self.w / "export"), "--model", str(self.w / "target"),
                "--data", str(self.w / "states")]

        def check(algorithm: str, must_pass: bool) -> Callable[[], dict[str, Any]]:
            def fn() -> dict[str, Any]:
                report = diagnose(self.w / "export", self.w / "target", self.w / "states", self._launch(algorithm))
                if report.ok != must_pass:
                    found = "; ".join(f"{c.name}: {c.detail}" for c in report.errors) or "no error"
                    raise CuratorError(f"demo: the doctor {'refused' if must_pass else 'passed'} the launch with "
                                       f"--speculative-algorithm {algorithm} ({found})")
                return {f"launch {algorithm}": "ok" if report.ok else
                        f"refused: {report.errors[0].name}"}
            return fn

        self._stage("doctor", curator_line([*base, "--launch", self._launch("EAGLE3")]), check("EAGLE3", True))
        # The original case's costly mistake: the doctor must refuse it.
        self._stage("doctor (EAGLE)", curator_line([*base, "--launch", self._launch("EAGLE")]), check("EAGLE", False))

    def eval(self) -> None:
        # the traffic's held-out conversations (build-mix kept them out of the mix), weighed by its profile
        prompts = self.w / "mix" / ".heldout"
        profile = self.w / "profile.json"
        out = self.w / "eval.json"
        argv = ["eval", "--model", str(self.w / "target"), "--draft", str(self.w / "export"), "--prompts", str(prompts),
                "--profile", str(profile), "--steps", str(self.s.eval_steps), "--max-new-tokens",
                str(self.s.eval_max_new_tokens), "--data", str(self.w / "states"), "--device", "cpu", "--json", str(out)]

        def fn() -> dict[str, Any]:
            from curator.evaluation.measure import measure
            from curator.mix.prompts import mix_prompts
            from curator.evaluation.weighting import eval_weights
            from training.eval.evaluate import load_target
            from training.eval.prompts import held_out_split
            from training.drafts.registry import load_export

            chosen, _ = mix_prompts(prompts)
            weights = eval_weights(profile, prompts)  # the category map the held-out split recorded
            target, tokenizer = load_target(self.w / "target", "cpu")
            drafter = load_export(self.w / "export", self.w / "target")
            result = measure(target, tokenizer, drafter, chosen, steps=self.s.eval_steps,
                             max_new_tokens=self.s.eval_max_new_tokens, tie_margin=1e-4, weights=weights,
                             offline=(self.w / "states", self.w / "target", held_out_split(self.w / "export")))
            data = {"model": str(self.w / "target"), "draft": str(self.w / "export"), "prompts": str(prompts),
                    "profile": str(profile), **result.to_json()}
            write_json(out, data)
            self.report.acceptance_length = data["acceptance_length"]
            self.report.acceptance_measured = [r["rate"] for r in data["overall"]["per_position"]]
            agentic = (data.get("categories") or {}).get("agentic") or {}
            self.report.acceptance_agentic = agentic.get("acceptance_length")
            self.report.acceptance_traffic = result.traffic["acceptance_length"]
            simulated = (data.get("offline_estimate") or {}).get("simulated") or {}
            if simulated.get("acceptance_length") is not None:
                self.report.acceptance_length_estimated = float(simulated["acceptance_length"])
            self.report.acceptance_estimated = [float(r["rate"]) for r in simulated["overall"]["per_position"]
                                                if r["rate"] is not None] if simulated else []
            self.report.eval_steps = self.s.eval_steps
            k = f"K={self.s.eval_steps}"
            return {"prompts": data["prompts_decoded"], f"acceptance length, measured ({k})": self.report.acceptance_length,
                    f"traffic-weighted ({k})": self.report.acceptance_traffic,
                    f"agentic prompts ({k})": self.report.acceptance_agentic,
                    f"simulated ({k})": self.report.acceptance_length_estimated}

        self._stage("eval", curator_line(argv), fn)

    def serve(self) -> None:
        from curator.demo.serve import STAGE, launch_args, serve_and_measure

        assert self.serve_python is not None
        command = shlex.join(["python", "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.w / "target"),
                              *launch_args(self.w / "export", self.s.eval_steps)])

        def fn() -> dict[str, Any]:
            assert self.serve_python is not None
            return serve_and_measure(self.serve_python, self.w, steps=self.s.eval_steps,
                                     max_new_tokens=self.s.eval_max_new_tokens,
                                     eval_acceptance=self.report.acceptance_length)

        self._stage(STAGE, f"serve the draft in the real engine and read its acceptance: {command}", fn)

    def finish(self) -> None:
        html_path = write_html(self.report, self.w / "report.html")
        (self.w / "report.json").write_text(json.dumps(
            {"stages": [asdict(s) for s in self.report.stages], "mix": self.report.mix_counts,
             "warnings": self.report.warnings,
             "acceptance_length": self.report.acceptance_length,
             "acceptance_length_estimated": self.report.acceptance_length_estimated,
             "acceptance_length_agentic": self.report.acceptance_agentic,
             "acceptance_length_traffic": self.report.acceptance_traffic,
             "traffic_shares": self.report.traffic_shares}, indent=1, default=str))
        console.rule("[bold]report")
        console.print(summary_table("curator demo", summary_rows(self.report)))
        for warning in self.report.warnings:
            console.print(f"[bold yellow]warning:[/] {warning}", highlight=False)
        console.print(f"open [bold]{html_path}[/] in a browser for the plots")
        review = curator_line(["sql", "SELECT * FROM candidate_summary ORDER BY best_relevance DESC", "--catalog",
                       str(self.catalog)])
        console.print(f"review what the scouts found: [bold]{escape(review)}[/]", highlight=False)


def run_demo(workdir: str | Path, settings: DemoSettings | None = None, fresh: bool = False,
             serve_python: str | None = None) -> DemoReport:
    """Run the whole demo in `workdir` (taking up an earlier run there unless `fresh`); return its report.
    With `serve_python` (the python of an environment with vLLM) it ends by serving its draft there."""
    return Demo(workdir, settings, fresh, serve_python).run()
