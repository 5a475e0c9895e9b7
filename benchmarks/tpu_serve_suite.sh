#!/usr/bin/env bash
# Issue 53's measurements on a one-chip TPU v5e machine, in one call, each part time-boxed:
#   0. the machine (Python, JAX) and whether its package index or wheel folder holds vLLM's TPU backend;
#   1. benchmarks/serve.py --profile tpu: Qwen2.5-0.5B shapes in bf16, 256 requests at once and at a fixed
#      rate, output tokens/s, time to first token p50/p90, the host's share of a step, the decode step
#      with 128 rows against the HBM roofline (serve_tpu.json);
#   2. benchmarks/serve_first_request.py: `halyard serve` of a 0.5B model on a unix socket, start to first
#      answer, cold and warm compilation cache (serve_first_request.json, server_*.log);
#   3. benchmarks/serve_deterministic.py: deterministic mode's promise on the chip and its cost vs fast mode
#      (serve_deterministic.json; the last line of its log is the verdict);
#   4. benchmarks/rl_tpu.py: `train --config grpo-demo` on the chip (sampler/trainer log-prob difference per
#      step), a Qwen2.5-0.5B-shaped GRPO step split into rollouts / hand-over / training, the quick shape's
#      split on the machine's CPU (rl_tpu.json, demo.log, split_*.log).
#
#   bash benchmarks/tpu_serve_suite.sh WHEELS_DIR OUT_DIR     # e.g. bash benchmarks/tpu_serve_suite.sh .whl-tpu "$OUT"
#
# WHEELS_DIR: `.venv/bin/python tools/tpu_install.py build` made it here (git-ignored; carry it); "none": use
# the Python on PATH as it is. SIZE=small runs every part at its tiny size (a CPU check of the suite:
# PATH=.venv/bin:$PATH SIZE=small bash benchmarks/tpu_serve_suite.sh none out/). Run from the
# repository root. LIMIT_S (default 450) bounds the whole; PARTS (default "1 2 3 4") picks parts;
# SHARE1..SHARE4 override a part's seconds (130, 140, 60, 70); PHASE_S (25) cuts each serving phase;
# DET_DTYPE (bfloat16) is part 3's parameter dtype; DEMO_STEPS (10) grpo-demo's steps. A part
# starts only while its minimum is left and is killed at its share; every script writes its JSON after
# each phase, so a cut-off part keeps what it measured.
set -uo pipefail
WHEELS="${1:?usage: tpu_serve_suite.sh WHEELS_DIR OUT_DIR}"
OUT_DIR="${2:?usage: tpu_serve_suite.sh WHEELS_DIR OUT_DIR}"
LIMIT_S="${LIMIT_S:-450}"
PARTS="${PARTS:-1 2 3 4}"
SIZE="${SIZE:-tpu}"
if [[ "$SIZE" == tpu ]]; then PROFILE=tpu; SHAPE=qwen-0.5b; else PROFILE=tpu-small; SHAPE=quick; fi
START=$(date +%s)
mkdir -p "$OUT_DIR"
exec > >(tee -a "$OUT_DIR/log.txt") 2>&1
export PYTHONUNBUFFERED=1
elapsed() { echo $(( $(date +%s) - START )); }
left() { echo $(( LIMIT_S - $(elapsed) )); }
part() { echo; echo "=== $* (at $(elapsed) s, $(date -u +%H:%M:%S) UTC)"; }
# share SECONDS MINIMUM: SECONDS, or what is left if less; 0 when less than MINIMUM is left.
# SCALE (default 1) multiplies every share and minimum (a slower machine).
share() {
    local l want=$(( $1 * ${SCALE:-1} )) least=$(( $2 * ${SCALE:-1} )); l=$(left)
    if (( l < least )); then echo 0; elif (( l < want )); then echo "$l"; else echo "$want"; fi
}
wanted() { [[ " $PARTS " == *" $1 "* ]]; }

part "0. machine, vLLM's TPU backend"
python3 -c 'import platform, jax; print("python", platform.python_version(), "glibc", platform.libc_ver()[1], "jax", jax.__version__)'
{
    echo "python3: $(python3 --version 2>&1)"
    echo "index /opt/pypi/simple: $(ls /opt/pypi/simple 2>/dev/null | wc -l) names; vllm/tpu-inference/torchax/torch there:"
    ls /opt/pypi/simple 2>/dev/null | grep -i -E '^(vllm|vllm-tpu|tpu-inference|tpu_inference|torchax|torch|torchvision|libtpu)$' || echo "  (none)"
    echo "/opt/wheels:"; ls /opt/wheels 2>/dev/null | grep -i -E 'vllm|tpu|torch' || echo "  (none of vllm/tpu/torch)"
} | tee "$OUT_DIR/vllm_check.txt"

part "install"
if [[ "$WHEELS" != none ]]; then
    eval "$(python3 tools/tpu_install.py install --wheels "$WHEELS")" || { echo "install failed"; exit 1; }
fi
CACHE=/tmp/halyard-serve-cache  # the serve profile's compilation cache (part 2 keeps its own, emptied: cold)

if wanted 1; then
    part "1. serve.py --profile $PROFILE"
    t=$(share "${SHARE1:-130}" 60)
    if (( t > 0 )); then
        timeout -k 5 "$t" python3 benchmarks/serve.py --profile "$PROFILE" --phase-seconds "${PHASE_S:-25}" \
            --compilation-cache "$CACHE" --output "$OUT_DIR/serve_tpu.json" 2>&1 | grep -v "compiled step shape" \
            | tail -30
        echo "exit ${PIPESTATUS[0]}"
    else echo "skipped: $(left) s left"; fi
fi

if wanted 2; then
    part "2. serve_first_request.py (halyard serve on a unix socket, cold and warm)"
    t=$(share "${SHARE2:-140}" 50)
    if (( t > 0 )); then
        timeout -k 5 "$t" python3 benchmarks/serve_first_request.py --size "$SIZE" --work /tmp/first-request \
            --limit $(( t / 2 )) --output "$OUT_DIR/serve_first_request.json" 2>&1 | tail -8
        echo "exit ${PIPESTATUS[0]}"
        cp /tmp/first-request/server_*.log "$OUT_DIR/" 2>/dev/null
    else echo "skipped: $(left) s left"; fi
fi

if wanted 3; then
    part "3. serve_deterministic.py"
    t=$(share "${SHARE3:-60}" 40)
    if (( t > 0 )); then
        timeout -k 5 "$t" python3 benchmarks/serve_deterministic.py --size "$SIZE" --dtype "${DET_DTYPE:-bfloat16}" --limit $(( t - 25 )) \
            --output "$OUT_DIR/serve_deterministic.json" 2>&1 | tail -16
        echo "exit ${PIPESTATUS[0]}"
    else echo "skipped: $(left) s left"; fi
fi

if wanted 4; then
    part "4. rl_tpu.py (grpo-demo, the GRPO step split)"
    t=$(share "${SHARE4:-70}" 40)
    if (( t > 0 )); then
        timeout -k 5 "$t" python3 benchmarks/rl_tpu.py --work /tmp/rl-tpu --demo-steps "${DEMO_STEPS:-10}" \
            --shapes "$SHAPE" --cpu-too --limit $(( t - 5 )) --output "$OUT_DIR/rl_tpu.json" 2>&1 | tail -12
        echo "exit ${PIPESTATUS[0]}"
        cp /tmp/rl-tpu/*.log "$OUT_DIR/" 2>/dev/null
    else echo "skipped: $(left) s left"; fi
fi

part "done"
ls -la "$OUT_DIR"
