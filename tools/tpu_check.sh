#!/usr/bin/env bash
# Everything issue 51 asks of a one-chip TPU v5e machine, in one go, with a log of each part:
#   1. install Halyard from the carried wheels (tools/tpu_install.py; no network there);
#   2. the TPU-only tests, with the machine's own TPU_* variables: the same config twice gives the same
#      loss bits, kill -9 after a checkpoint and resume gives the uninterrupted run's bits, generate / eval /
#      replay (bitwise) on the chip, the invariant step (trainer.invariant) twice to the same bits;
#   3. benchmarks/tpu_train.py: Llama-3.2-1B shapes at seq 2048, tokens/s and MFU. BENCH_ARGS holds the
#      benchmark calls' arguments, separated by '|'; a call starts only while LIMIT_S - 150 s are not used.
#
#   bash tools/tpu_check.sh WHEELS_DIR OUT_DIR        # e.g. bash tools/tpu_check.sh ../.whl-tpu "$OUT"
#
# Run from the repository root. Logs and results go to OUT_DIR (log.txt, pytest.txt, tpu_train*.json/md).
set -uo pipefail
WHEELS="${1:?usage: tpu_check.sh WHEELS_DIR OUT_DIR}"
OUT_DIR="${2:?usage: tpu_check.sh WHEELS_DIR OUT_DIR}"
LIMIT_S="${LIMIT_S:-590}"  # the device call's limit: what comes after it is lost
START=$(date +%s)
mkdir -p "$OUT_DIR"
exec > >(tee -a "$OUT_DIR/log.txt") 2>&1
export PYTHONUNBUFFERED=1
elapsed() { echo $(( $(date +%s) - START )); }
part() { echo; echo "=== $* (at $(elapsed) s, $(date -u +%H:%M:%S) UTC)"; }

part "machine"
python3 -c 'import platform, jax, importlib.util; print(platform.python_version(), platform.libc_ver(), "jax", jax.__version__, "libtpu", importlib.util.find_spec("libtpu") is not None)'
env | grep '^TPU_' | sed 's/=\(.\{80\}\).*/=\1.../'

part "1. install"
eval "$(python3 tools/tpu_install.py install --wheels "$WHEELS")" || exit 1
command -v train halyard

part "2. TPU-only tests"
HALYARD_TEST_TPU=1 timeout "${TEST_TIMEOUT_S:-300}" python3 -m pytest -p no:cacheprovider -v -m tpu -rA \
    packages/train/tests/test_on_tpu.py 2>&1 | tee "$OUT_DIR/pytest.txt" | tail -25

part "3. benchmark"
DEFAULT_BENCH="--remat save_dots --attention auto --batch-size 8 --accumulation 4 --steps 8 --timeout 150 -- --model.num_layers 8 --model.vocab_size 32000"
IFS='|' read -ra CALLS <<< "${BENCH_ARGS:-$DEFAULT_BENCH}"
index=0
for call in "${CALLS[@]}"; do
    index=$((index + 1))
    if (( $(elapsed) > LIMIT_S - 150 )); then echo "skipped (at $(elapsed) s): $call"; continue; fi
    # shellcheck disable=SC2086  # each call is a list of arguments
    python3 benchmarks/tpu_train.py --output "$OUT_DIR/tpu_train_$index.json" $call 2>&1 | tail -8
done

part "done"
