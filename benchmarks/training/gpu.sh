#!/usr/bin/env bash
# The ~1B Llama training step on one accelerator (see benchmarks/training/gpu_llama.py): tokens/s and MFU for
# remat none / save_dots x attention xla / cudnn / blocked, table in benchmarks/results/gpu_llama.md.
#
#   bash benchmarks/training/gpu.sh                # on the first GPU (needs the GPU extra: jax[cuda12])
#   bash benchmarks/training/gpu.sh --cpu-smoke    # the same code at tiny size on CPU (run by the test suite)
#
# Any other flag goes to gpu_llama.py (--remat, --attention, --steps, --max-batch, --seq-len).
set -euo pipefail
cd "$(dirname "$0")/../.."  # the repository root
PYTHON="${PYTHON:-.venv/bin/python}"
[[ -x "$PYTHON" ]] || PYTHON=python3

if [[ " $* " == *" --cpu-smoke "* ]]; then
    export JAX_PLATFORMS=cpu
else
    # JAX preallocates 75% of GPU memory by default; the batch search plans against what JAX may use.
    export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.95}"
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
fi
exec "$PYTHON" benchmarks/training/gpu_llama.py "$@"
