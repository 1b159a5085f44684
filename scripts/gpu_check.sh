#!/usr/bin/env bash
# GPU check for a lent CUDA machine (issue 11): about 7 minutes on one H200 (the twenty-ninth session's
# run: tests 108 s, tier tests 10 s, bench engine 161 s with three servers, bench tiers 68 s), results under $OUT.
#
#   OUT=/tmp/gpu_out bash scripts/gpu_check.sh
#
# On a CUDA machine with PyTorch but no package index (the lent H200's image): `bash scripts/gpu_bundle.sh` here
# (wheels, the tokenizer, the calibration into .gpu/), carry .gpu/ there, `source .gpu/env.sh`, then the above.
#
# 1. the CUDA tests (every test that skips without CUDA runs here: compiled step, w8a8, int8 / fp8
#    KV cache, the batched speculative verify, decode CUDA graphs vs eager tokens; the copy stream's
#    write-downs: a look below and a prefetch while their store is in flight);
# 2. hintkv bench engine --device cuda --quick (dummy:llama3-8b, bf16, against the plain-SDPA H200
#    calibration in shared/calibration/h200-llama3-8b-shape.json; decode b1 / b8 with CUDA graphs
#    (the default) and without (variant no-graphs), graphs of the eager regions (no-compile), and fully eager);
# 3. hintkv bench tiers --device cuda (dummy:llama3-8b, bf16, 8K context: its GPU goals; the swarm part is a CPU-scale run, skipped).
# Each step has its own time limit, so one that hangs cannot eat the others' time; the exit
# status is non-zero when any step failed (each step's log says which).
set -uo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"
OUT="${OUT:-$REPO/gpu_out}"
mkdir -p "$OUT"
if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY="${PYTHON:-python3}"; fi
export HINTKV_CALIBRATION="${HINTKV_CALIBRATION:-$REPO/../shared/calibration/h200-llama3-8b-shape.json}"
status=0

step() {  # step NAME SECONDS CMD...
    local name="$1" limit="$2"; shift 2
    local t0=$SECONDS
    echo "== $name (limit ${limit}s)" | tee -a "$OUT/summary.txt"
    timeout "$limit" "$@" > "$OUT/$name.out" 2> "$OUT/$name.err"
    local rc=$?
    echo "   rc=$rc in $((SECONDS - t0))s" | tee -a "$OUT/summary.txt"
    [ "$rc" -eq 0 ] || status=1
}

{ nvidia-smi; "$PY" -c 'import torch; print(torch.__version__, torch.cuda.is_available(), torch.cuda.get_device_name(0))'; } \
    > "$OUT/device.txt" 2>&1
step cuda_tests 170 "$PY" -m pytest -q -p no:cacheprovider -rs tests/models/test_cuda.py tests/models/test_cuda_graphs.py
# the write-downs on the copy stream (a look below while their store is in flight) and their neighbours on the CPU
step cuda_tier_tests 50 "$PY" -m pytest -q -p no:cacheprovider -rs tests/cache/test_evicted_look_below.py tests/cache/test_tier_threads.py
# variants: no-graphs (decode CUDA graphs off: their effect on decode b1 / b8 is this row's ratio,
# inverted), eager (--enforce-eager: neither graphs nor compile) and no-compile (graphs, regions not compiled)
step bench_engine 300 "$PY" -m hintkv bench engine --device cuda --quick --variants no-graphs,eager,no-compile
# tiers: the issue-4 GPU goals are defined on dummy:llama3-8b at 8K (--quick would pick dummy:tiny at 2K)
step bench_tiers 120 "$PY" -m hintkv bench tiers --device cuda --models dummy:llama3-8b --contexts 8192 --dtype bfloat16 --skip-swarm
tail -n 1 "$OUT/bench_engine.out" > "$OUT/bench_engine.json" 2>/dev/null || true
tail -n 1 "$OUT/bench_tiers.out" > "$OUT/bench_tiers.json" 2>/dev/null || true
exit $status
