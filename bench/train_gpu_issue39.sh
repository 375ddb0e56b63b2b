#!/usr/bin/env bash
# Issue 39's GPU measurements in one call (one H200): long context (Kimi-shaped draft at 16K/32K/64K,
# TTT steps kept vs recomputed) and the benchmark shape's before/after (compiled = issue 28's step,
# fused = this issue's), with the GPU equivalence check and a profile of both.
#   bash bench/train_gpu_issue39.sh OUT_DIR [extra train_gpu.py args]
set -uo pipefail
out=${1:?out dir}; shift
mkdir -p "$out"
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  python3 -c 'import sys, torch, transformers; print(sys.version.split()[0], torch.__version__, transformers.__version__)'
} > "$out/env.txt" 2>&1
python3 bench/train_gpu.py --path compiled,fused --check --profile --long 16384,32768,65536 \
    --long-recompute off,on --out-dir "$out" "$@" > "$out/log.txt" 2>&1
rc=$?
cat "$out/env.txt" "$out/table.txt" 2>/dev/null
grep -E "^long |Error|error" "$out/log.txt" | cut -c1-400 | tail -20
exit $rc
