#!/usr/bin/env bash
# Issue 53: the engine with the Pallas ragged paged kernel on a one-chip TPU v5e, in one time-boxed call (LIMIT_S,
# default 230 s). The engine's model is given `pallas` for `auto` (ENGINE below: benchmarks/serve.py run with that
# one substitution; since 2026-12-06 `auto` is `pallas` on a TPU anyway, so a checkout before that runs it too):
#   1. the tiny Qwen2 engine (`serve.py --profile tpu-small`): its warm-up runs every step shape on pure
#      padding (num_seqs 0, the step that halted the chip before the fix), then 24 requests;
#   2. the kernel compiled for the chip against its reference (`pytest -m tpu`, test_ragged_paged_pallas.py);
#   3. Qwen2.5-0.5B's shapes (`serve.py --profile tpu`, no warm-up, the decode phase: 128 rows against the
#      HBM roofline) with what time is left.
#
#   bash benchmarks/tpu_pallas_engine.sh WHEELS_DIR OUT_DIR      # e.g. .whl-tpu "$OUT"
#
# WHEELS_DIR: `.venv/bin/python tools/tpu_install.py build` made it (git-ignored; carry it); "none": the Python
# on PATH as it is (a CPU rehearsal, the kernel interpreted: PATH=.venv/bin:$PATH CAP1=200 LIMIT_S=400 bash
# benchmarks/tpu_pallas_engine.sh none out/). CAP1, CAP2, CAP3 (45, 60, 200) cap the parts. Run from the
# repository root. Logs: OUT_DIR/log.txt; JSON: OUT_DIR/serve_small.json, OUT_DIR/serve_tpu.json.
set -uo pipefail
WHEELS="${1:?usage: tpu_pallas_engine.sh WHEELS_DIR OUT_DIR}"
OUT_DIR="${2:?usage: tpu_pallas_engine.sh WHEELS_DIR OUT_DIR}"
LIMIT_S="${LIMIT_S:-230}"
START=$(date +%s)
mkdir -p "$OUT_DIR"
exec > >(tee -a "$OUT_DIR/log.txt") 2>&1
export PYTHONUNBUFFERED=1
left() { echo $(( LIMIT_S - $(date +%s) + START )); }
part() { echo; echo "=== $* (at $(( $(date +%s) - START )) s, $(date -u +%H:%M:%S) UTC)"; }
# cap SECONDS: SECONDS, or what is left if less (at least 1)
cap() { local l; l=$(left); if (( l < $1 )); then echo $(( l > 1 ? l : 1 )); else echo "$1"; fi; }

ENGINE='import runpy, sys, jax
import halyard.models.decoder.model as model
from halyard.models.attention.dispatch import paged_kernel
model.paged_kernel = lambda implementation="auto": paged_kernel("pallas" if implementation == "auto" else implementation)
print("jax", jax.__version__, jax.devices()[0].device_kind, "engine kernel:", type(model.paged_kernel()).__name__)
sys.argv = ["benchmarks/serve.py", *sys.argv[1:]]
sys.path.insert(0, "benchmarks")
runpy.run_path("benchmarks/serve.py", run_name="__main__")'

part "install"
if [[ "$WHEELS" != none ]]; then
    eval "$(timeout 90 python3 tools/tpu_install.py install --wheels "$WHEELS")" || { echo "install failed"; exit 1; }
fi

part "1. the tiny engine with the Pallas kernel: warm-up on padding, 24 requests"
timeout -k 5 "$(cap "${CAP1:-45}")" python3 -c "$ENGINE" --profile tpu-small --phases at_once --phase-seconds 20 \
    --output "$OUT_DIR/serve_small.json" 2>&1 | tail -14
echo "exit ${PIPESTATUS[0]}"

part "2. the kernel compiled for the chip against its reference"
HALYARD_TEST_TPU=1 timeout -k 5 "$(cap "${CAP2:-60}")" python3 -m pytest -q -p no:cacheprovider -m tpu \
    packages/models/tests/test_ragged_paged_pallas.py 2>&1 | tail -15
echo "exit ${PIPESTATUS[0]}"

part "3. Qwen2.5-0.5B's shapes: the decode phase (128 rows) against the roofline"
timeout -k 5 "$(cap "${CAP3:-200}")" python3 -c "$ENGINE" --profile tpu --no-warmup --phases decode at_once \
    --phase-seconds 25 --output "$OUT_DIR/serve_tpu.json" 2>&1 | tail -14
echo "exit ${PIPESTATUS[0]}"
part "done"
