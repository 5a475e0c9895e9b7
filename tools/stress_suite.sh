#!/usr/bin/env bash
# The test files most sensitive to a slow machine (many simulated devices, several processes, kill -9 and
# resume) run ROUNDS times with a CPU hog on every core beside them: a test that passes only on an idle
# machine fails here. Each round is one pytest run; the script says pass or fail per round and ends non-zero
# if any round failed. A crashed test worker is reported with its stacks (tools/pytest_crash_report.py).
#
#   tools/stress_suite.sh                    5 rounds of the stress files, 2 hogs, 3 xdist workers (make stress)
#   tools/stress_suite.sh --rounds 2 --workers 0   2 rounds in one process (no xdist)
#   tools/stress_suite.sh --files parity --hogs 0 --isa native,AVX2,AVX --rounds 1
#                                            the family and engine parity files once per instruction set
#                                            XLA's CPU backend may use (make parity-isa); default: the
#                                            suite's own (conftest.py: AVX), native: this CPU's best
#   tools/stress_suite.sh -- -k replicas     arguments after -- go to pytest
#
# With the stress files (not parity), a determinism soak follows the rounds, the hogs still running:
# tools/determinism_soak.py sends --soak-requests requests (default 2000) through `halyard serve
# --deterministic` --soak-rounds times (default 3), each compared with the same request served alone;
# --soak-requests 0 skips it. Its log: soak.log in --logs.
#
# Logs: one per round and instruction set in --logs (default .stress/), kept for reading afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."

STRESS_FILES=(
    packages/serve/tests/test_sharded_engine.py
    packages/train/tests/test_invariant_trainer.py
    packages/train/tests/test_invariant_step.py
    packages/train/tests/test_invariant_layer_gathers.py
    packages/models/tests/test_pipeline.py
    packages/train/tests/test_pipeline_trainer.py
    packages/models/tests/test_context_parallel_attention.py
    packages/train/tests/test_context_parallel_trainer.py
    packages/train/tests/test_matrix_trainer.py
    packages/shard/tests/test_multiprocess.py
    packages/train/tests/test_trainer_multiprocess.py
    packages/train/tests/test_checkpoint_multiprocess.py
    packages/export/tests/test_multiprocess_export.py
    tests/reliability/test_multiprocess_death.py
    tests/reliability/test_training_kill.py
    packages/data-cache/tests/test_kill_resume.py
)
# Files that compare one computation with another (cached decoding, the engine, sharded steps, transformers):
# where XLA's CPU backend picks other kernels on another CPU, these see it.
PARITY_FILES=(
    packages/models/tests/test_family_gemma.py
    packages/models/tests/test_family_olmo2.py
    packages/models/tests/test_family_phi3.py
    packages/models/tests/test_family_qwen3.py
    packages/models/tests/test_paged_decoding.py
    packages/models/tests/test_qwen2_sliding_window.py
    packages/serve/tests/test_engine.py
    packages/serve/tests/test_sharded_engine.py
    tests/test_serve_transformers_generate.py
)

ROUNDS=5
HOGS=$(nproc)
WORKERS=3
ISAS=default
FILES=stress
LOGS=.stress
SOAK_REQUESTS=2000
SOAK_ROUNDS=3
PYTHON=${PYTHON:-.venv/bin/python}
while [[ $# -gt 0 ]]; do
    case $1 in
        --rounds) ROUNDS=$2; shift 2 ;;
        --hogs) HOGS=$2; shift 2 ;;
        --workers) WORKERS=$2; shift 2 ;;
        --isa) ISAS=$2; shift 2 ;;
        --files) FILES=$2; shift 2 ;;
        --logs) LOGS=$2; shift 2 ;;
        --soak-requests) SOAK_REQUESTS=$2; shift 2 ;;
        --soak-rounds) SOAK_ROUNDS=$2; shift 2 ;;
        --) shift; break ;;
        *) echo "stress_suite.sh: unknown argument $1 (see the top of $0)" >&2; exit 2 ;;
    esac
done
case $FILES in
    stress) SELECTED=("${STRESS_FILES[@]}") ;;
    parity) SELECTED=("${PARITY_FILES[@]}") ;;
    *) echo "stress_suite.sh: --files $FILES: give stress or parity" >&2; exit 2 ;;
esac
if [[ $WORKERS -gt 0 ]]; then
    # As make test runs them: workers that retire, files longest first, a crashed worker's stacks reported.
    PYTEST_RUN=(-n "$WORKERS" --maxschedchunk 16 -p tools.pytest_worker_life --worker-tests 300)
else
    PYTEST_RUN=(-p no:xdist)
fi
mkdir -p "$LOGS"

HOG_PIDS=()
stop_hogs() {
    for pid in "${HOG_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    HOG_PIDS=()
}
trap stop_hogs EXIT
for _ in $(seq 1 "$HOGS"); do
    # a busy loop at the tests' own priority, one per core
    sh -c 'while :; do :; done' &
    HOG_PIDS+=($!)
done

BASE_XLA_FLAGS=${XLA_FLAGS:---xla_force_host_platform_device_count=8}
failed=0
runs=0
for round in $(seq 1 "$ROUNDS"); do
    for isa in ${ISAS//,/ }; do
        isa_env=()
        [[ $isa != default ]] && isa_env=(HALYARD_TEST_ISA="$isa")
        log="$LOGS/round-$round-$isa.log"
        start=$(date +%s)
        status=0
        env "${isa_env[@]}" XLA_FLAGS="$BASE_XLA_FLAGS" "$PYTHON" -m pytest -q "${PYTEST_RUN[@]}" -p tools.pytest_crash_report \
            "${SELECTED[@]}" "$@" >"$log" 2>&1 || status=$?
        summary=$(grep -E "(passed|failed|error).* in [0-9.]+s" "$log" | tail -1 || true)
        runs=$((runs + 1))
        if [[ $status -eq 0 ]]; then
            verdict=pass
        else
            verdict=FAIL
            failed=$((failed + 1))
        fi
        echo "round $round ($isa, $HOGS hogs): $verdict in $(($(date +%s) - start)) s: ${summary:-no summary, see $log}"
        [[ $status -eq 0 ]] || grep -E "^(FAILED|ERROR) |crashed while running" "$log" | sed 's/^/    /' || true
    done
done
echo "$((runs - failed))/$runs green (logs in $LOGS/)"
if [[ $FILES == stress && $SOAK_REQUESTS -gt 0 ]]; then
    start=$(date +%s)
    soak_status=0
    "$PYTHON" tools/determinism_soak.py --requests "$SOAK_REQUESTS" --rounds "$SOAK_ROUNDS" \
        --log "$LOGS/soak-server.log" >"$LOGS/soak.log" 2>&1 || soak_status=$?
    grep -E "^(round|determinism soak)" "$LOGS/soak.log" | sed 's/^/    /' || true
    echo "determinism soak ($SOAK_REQUESTS requests, $SOAK_ROUNDS rounds, $HOGS hogs): \
$([[ $soak_status -eq 0 ]] && echo pass || echo FAIL) in $(($(date +%s) - start)) s (log: $LOGS/soak.log)"
    [[ $soak_status -eq 0 ]] || failed=$((failed + 1))
fi
[[ $failed -eq 0 ]]
