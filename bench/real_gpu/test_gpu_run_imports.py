"""gpu_run.py runs on the device, where only torch, transformers, safetensors, numpy and the gguf
wheel are installed: importing it and every module its stages import must pull in none of curator's
heavy dependencies.

    python -m pytest -q bench/real_gpu/test_gpu_run_imports.py
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# curator's own dependencies and packages (yaml, httpx and h11 come with transformers: not listed)
HEAVY = ("pyarrow", "duckdb", "pydantic", "typer", "rich", "datasketch", "pandas", "fastapi", "uvicorn",
         "curator.cli", "curator.mix", "curator.traffic", "curator.rows", "curator.generate", "curator.store")

PROBE = """
import json, sys
sys.path.insert(0, {root!r})
import bench.real_gpu.gpu_run  # noqa
# what the stages import lazily (A: the converter; C, D: training; E: the forecast check)
import curator.targets.convert, curator.forecast, bench.reference_multidomain.forecast_check  # noqa
import training.train.trainer, training.eval.evaluate, training.export.export, training.eagle3.load  # noqa
import training.capture.hidden_states, training.capture.online  # noqa
print(json.dumps(sorted(m for m in sys.modules)))
"""


def test_gpu_run_imports_no_heavy_dependency() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE.format(root=str(ROOT))], capture_output=True, text=True,
                         check=True, cwd="/", env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    loaded = set(json.loads(out.stdout.strip().splitlines()[-1]))
    bad = sorted(m for m in loaded if any(m == h or m.startswith(h + ".") for h in HEAVY))
    assert not bad, f"gpu_run's stages import {bad}: absent on the device"
