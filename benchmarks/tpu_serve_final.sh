#!/usr/bin/env bash
# Issue 53's two serving figures on a one-chip TPU v5e, in one call, each part time-boxed:
#   0. benchmarks/tpu_decode_kernel_parts.py: the token decode kernel whole, copies only, arithmetic only;
#   1. benchmarks/serve_tpu.py --phases decode: the decode step of 128 rows against the HBM roofline;
#   2. benchmarks/serve_first_request.py: `halyard serve --hf` on a unix socket, start to first answer, cold
#      and warm compilation cache;
#   3. (if at least PHASES_MIN_S are left of LIMIT_S) benchmarks/serve_start_phases.py: where a start goes.
#   bash benchmarks/tpu_serve_final.sh WHEELS_DIR OUT_DIR      # carry WHEELS_DIR (tools/tpu_install.py build)
# This checkout's packages go before the carried wheels' (the wheels may be older than the tree).
set -uo pipefail
WHEELS="${1:?usage: tpu_serve_final.sh WHEELS_DIR OUT_DIR}"
OUT_DIR="${2:?usage: tpu_serve_final.sh WHEELS_DIR OUT_DIR}"
LIMIT_S="${LIMIT_S:-460}"
PHASES_MIN_S="${PHASES_MIN_S:-110}"
START=$(date +%s)
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1
if [[ "$WHEELS" != none ]]; then eval "$(python3 tools/tpu_install.py install --wheels "$WHEELS" 2>"$OUT_DIR/install.log")"; fi
export PYTHONPATH="$(printf '%s:' "$PWD"/packages/*/src)${PYTHONPATH:-}"
left() { echo $(( LIMIT_S - ($(date +%s) - START) )); }
echo "=== kernel parts at $(date -u +%H:%M:%S)"
timeout 80 python3 benchmarks/tpu_decode_kernel_parts.py > "$OUT_DIR/kernel_parts.log" 2>&1; echo "rc $?"; grep '"part"' "$OUT_DIR/kernel_parts.log"
echo "=== decode at $(date -u +%H:%M:%S)"
timeout 250 python3 benchmarks/serve_tpu.py --phases decode --compilation-cache /tmp/jc --output "$OUT_DIR/serve_decode.json" > "$OUT_DIR/serve_decode.log" 2>&1
echo "rc $?"; grep -E "^decode|Error" "$OUT_DIR/serve_decode.log" | tail -3 | cut -c1-700
echo "=== first request at $(date -u +%H:%M:%S), $(left) s left"
timeout $(( $(left) > 150 ? 150 : $(left) )) python3 benchmarks/serve_first_request.py --size tpu --work /tmp/first --output "$OUT_DIR/first_request.json" > "$OUT_DIR/first_request.log" 2>&1
echo "rc $?"; tail -c 1500 "$OUT_DIR/first_request.json" 2>/dev/null; tail -4 "$OUT_DIR/first_request.log" | cut -c1-400
if (( $(left) >= PHASES_MIN_S )); then
  echo "=== start phases at $(date -u +%H:%M:%S), $(left) s left"
  (cd benchmarks && timeout $(( $(left) - 5 )) python3 serve_start_phases.py --size tpu --work /tmp/phases --output "$OUT_DIR/start_phases.json" > "$OUT_DIR/start_phases.log" 2>&1)
  echo "rc $?"; tail -c 2500 "$OUT_DIR/start_phases.json" 2>/dev/null
fi
