#!/usr/bin/env bash
# The token-by-token decode kernel on a one-chip TPU v5e, in one call (issue 53):
#   1. benchmarks/tpu_decode_kernel_check.py: compiled outputs against the reference; bits against JAX's kernel;
#   2. benchmarks/tpu_paged_attention.py: 128 decoding rows, ours ("decode") against JAX's ("never");
#   3. benchmarks/serve_tpu.py --phases decode: the engine's decode step against the HBM roofline.
#   bash benchmarks/tpu_decode_kernel.sh WHEELS_DIR OUT_DIR      # carry WHEELS_DIR (tools/tpu_install.py build)
set -uo pipefail
WHEELS="${1:?usage: tpu_decode_kernel.sh WHEELS_DIR OUT_DIR}"
OUT_DIR="${2:?usage: tpu_decode_kernel.sh WHEELS_DIR OUT_DIR}"
PARTS="${PARTS:-1 2 3}"
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1
if [[ "$WHEELS" != none ]]; then eval "$(python3 tools/tpu_install.py install --wheels "$WHEELS" 2>"$OUT_DIR/install.log")"; fi
# this checkout's packages before the carried wheels' (the wheels may be older than the tree)
export PYTHONPATH="$(printf '%s:' "$PWD"/packages/*/src)${PYTHONPATH:-}"
for part in $PARTS; do
  echo "=== part $part at $(date -u +%H:%M:%S)"
  case $part in
    1) timeout 240 python3 benchmarks/tpu_decode_kernel_check.py > "$OUT_DIR/check.json" 2> "$OUT_DIR/check.log"; echo "rc $?"; tail -c 3000 "$OUT_DIR/check.json"; tail -5 "$OUT_DIR/check.log" ;;
    2) timeout 200 python3 benchmarks/tpu_paged_attention.py --page-size 256 --context 550 2048 --no-blocked --by-token decode never --output "$OUT_DIR/attention.json" > "$OUT_DIR/attention.log" 2>&1; echo "rc $?"; grep '"kernel"' "$OUT_DIR/attention.log" | cut -c1-260; tail -3 "$OUT_DIR/attention.log" | cut -c1-400 ;;
    3) timeout 330 python3 benchmarks/serve_tpu.py --phases decode --compilation-cache /tmp/jc --output "$OUT_DIR/serve_decode.json" > "$OUT_DIR/serve_decode.log" 2>&1; echo "rc $?"; grep -E "^decode|Error|error" "$OUT_DIR/serve_decode.log" | tail -5 | cut -c1-600 ;;
  esac
done
