"""Print issue 50's tables from gpu_run.py's results JSON: arms x sizes (measured and simulated,
traffic-weighted, the seeds' spread), per category, the forecast's check, what was not run.

    python3 bench/real_gpu/report.py bench/results/real-gpu-results.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _cell(s: dict[str, Any] | None) -> str:
    if not s or not s.get("n"):
        return "not run"
    sd = f" ± {s['sd']:.3f}" if s.get("sd") is not None else ""
    return f"{s['mean']:.3f}{sd} (n={s['n']})"


def render(res: dict[str, Any]) -> str:
    lines = [f"device: {res.get('device')}"]
    b = res.get("stage_b") or {}
    lines.append(f"answers: {b.get('answered')} prompts, {b.get('output_tokens')} output tokens, "
                 f"{b.get('output_tokens_per_s')} tok/s; too long: {b.get('too_long')}")
    f = res.get("findings") or {}
    sizes = sorted({str(r["size"]) for r in (res.get("drafts") or {}).values()}, key=int)
    for key in ("measured_weighted", "simulated_weighted"):
        lines.append(f"\n{key} (traffic-weighted acceptance length, K={res.get('settings', {}).get('ttt_steps')})")
        lines.append("arm            " + "".join(f"{n:>26s}" for n in sizes))
        for arm, by in (f.get(key) or {}).items():
            lines.append(f"{arm:15s}" + "".join(f"{_cell(by.get(n)):>26s}" for n in sizes))
    lines.append("\nper draft: tag, measured per category | simulated per category, train tok/s")
    for tag, r in sorted((res.get("drafts") or {}).items()):
        lines.append(f"{tag:28s} {json.dumps(r.get('measured'))} | {json.dumps(r.get('simulated'))} "
                     f"{r.get('train_tokens_per_s')}")
    if res.get("forecast"):
        lines.append("\nforecast: " + json.dumps(res["forecast"])[:4000])
    lines.append("\nnot run: " + json.dumps(res.get("not_run") or {}, indent=1))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if len(args) != 1:
        print(__doc__)
        return 2
    print(render(json.loads(Path(args[0]).read_text(encoding="utf-8"))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
