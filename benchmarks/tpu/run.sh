#!/usr/bin/env bash
# Every measurement made on the lent one-chip TPU v5e machine, in one device call: install once, then the
# named parts in order, each time-boxed, each logging under OUT_DIR.
#
#   bash benchmarks/tpu/run.sh WHEELS_DIR OUT_DIR PART...      # e.g. .whl-tpu "$OUT" suite
#   bash benchmarks/tpu/run.sh none out/ --list                # the parts and the presets
#
# WHEELS_DIR: `.venv/bin/python tools/tpu_install.py build` made it here (git-ignored; carry it); "none": the
# Python on PATH as it is (a CPU rehearsal: PATH=.venv/bin:$PATH SIZE=small SCALE=4 LIMIT_S=3000 bash
# benchmarks/tpu/run.sh none out/ suite). This checkout's packages go before the carried wheels'. Run from the
# repository root. LIMIT_S (default 450) bounds the whole call; SHARE_<PART> (e.g. SHARE_SERVE=200) a part's
# seconds; SCALE multiplies every share (a slower machine); SIZE=small runs the serving parts at their tiny
# size. A part starts only while its minimum is left and is killed at its share; the scripts write their JSON
# after each phase, so a cut-off part keeps what it measured. Log: OUT_DIR/log.txt; each part's files:
# OUT_DIR/<part>.*.
set -uo pipefail
WHEELS="${1:?usage: run.sh WHEELS_DIR OUT_DIR PART... (--list: the parts)}"
OUT_DIR="${2:?usage: run.sh WHEELS_DIR OUT_DIR PART...}"
shift 2
LIMIT_S="${LIMIT_S:-450}"
SIZE="${SIZE:-tpu}"
if [[ "$SIZE" == tpu ]]; then PROFILE=tpu; SHAPE=qwen-0.5b; else PROFILE=tpu-small; SHAPE=quick; fi

# part: default seconds, minimum seconds, what it measures (the first line of each is what --list prints).
declare -A SECONDS_OF=(
    [machine]="20 5" [tests]="300 60" [train]="440 150" [levanter]="200 100"
    [serve]="130 60" [first-request]="140 50" [deterministic]="60 40" [rl]="70 40"
    [kernel-check]="240 60" [attention]="200 60" [decode]="250 60" [kernel-parts]="80 30"
    [start-phases]="110 60" [engine-small]="45 20" [kernel-tests]="60 30" [levanter-engine]="540 300"
)
declare -A PRESETS=(
    [check]="machine tests train"                                  # issue 51: tools/tpu_check.sh before
    [suite]="machine serve first-request deterministic rl"        # issue 53: tpu_serve_suite.sh before
    [final]="kernel-parts decode first-request start-phases"      # tpu_serve_final.sh before
    [decode-kernel]="kernel-check attention decode"               # tpu_decode_kernel.sh before
    [pallas-engine]="engine-small kernel-tests decode"            # tpu_pallas_engine.sh before
    [versus]="machine train levanter"                             # issue 68: Halyard and Levanter, one call
)
if [[ " $* " == *" --list "* ]]; then
    echo "parts:"; grep -E '^    [a-z-]+\) +# ' "$0" | sed -E 's/^    ([a-z-]+)\) +# /  \1: /'
    echo "presets:"; for name in "${!PRESETS[@]}"; do echo "  $name: ${PRESETS[$name]}"; done
    exit 0
fi
PARTS=()
for name in "${@:-suite}"; do
    if [[ -n "${PRESETS[$name]:-}" ]]; then read -ra more <<< "${PRESETS[$name]}"; PARTS+=("${more[@]}")
    elif [[ -n "${SECONDS_OF[$name]:-}" ]]; then PARTS+=("$name")
    else echo "unknown part '$name': bash benchmarks/tpu/run.sh none out/ --list names them" >&2; exit 2; fi
done

START=$(date +%s)
mkdir -p "$OUT_DIR"
exec > >(tee -a "$OUT_DIR/log.txt") 2>&1
export PYTHONUNBUFFERED=1
elapsed() { echo $(( $(date +%s) - START )); }
left() { echo $(( LIMIT_S - $(elapsed) )); }
# share PART: its seconds (SHARE_<PART> or the default, times SCALE), or what is left if less; 0 when less
# than its minimum is left.
share() {
    local want least l variable="SHARE_${1//-/_}"
    read -r want least <<< "${SECONDS_OF[$1]}"
    variable="${variable^^}"
    want=$(( ${!variable:-$want} * ${SCALE:-1} )); least=$(( least * ${SCALE:-1} )); l=$(left)
    if (( l < least )); then echo 0; elif (( l < want )); then echo "$l"; else echo "$want"; fi
}

echo "=== install (at $(elapsed) s, $(date -u +%H:%M:%S) UTC)"
if [[ "$WHEELS" != none ]]; then
    eval "$(timeout 120 python3 tools/tpu_install.py install --wheels "$WHEELS" 2>"$OUT_DIR/install.log")" \
        || { echo "install failed: $OUT_DIR/install.log"; exit 1; }
fi
export PYTHONPATH="$(printf '%s:' "$PWD"/packages/*/src)${PYTHONPATH:-}"
CACHE=/tmp/halyard-serve-cache  # the serving parts' compilation cache (first-request keeps its own: cold)

run_part() {  # run_part PART SECONDS: the part's command, its output in OUT_DIR/PART.log
    local t=$2 out="$OUT_DIR/$1"
    case $1 in
    machine)  # Python, JAX, libtpu, the TPU_* variables, and whether the machine's index holds vLLM's TPU backend
        python3 -c 'import platform, jax, importlib.util; print("python", platform.python_version(), "glibc", platform.libc_ver()[1], "jax", jax.__version__, "libtpu", importlib.util.find_spec("libtpu") is not None)'
        env | grep '^TPU_' | sed 's/=\(.\{80\}\).*/=\1.../'
        {
            echo "index /opt/pypi/simple: $(ls /opt/pypi/simple 2>/dev/null | wc -l) names; vllm/tpu-inference/torchax/torch there:"
            ls /opt/pypi/simple 2>/dev/null | grep -i -E '^(vllm|vllm-tpu|tpu-inference|tpu_inference|torchax|torch|torchvision|libtpu)$' || echo "  (none)"
            echo "/opt/wheels:"; ls /opt/wheels 2>/dev/null | grep -i -E 'vllm|tpu|torch' || echo "  (none of vllm/tpu/torch)"
        } | tee "$out.vllm_check.txt" ;;
    tests)  # the TPU-only tests: same loss bits twice, kill -9 and resume, commands on the chip, the invariant step
        HALYARD_TEST_TPU=1 timeout -k 5 "$t" python3 -m pytest -p no:cacheprovider -v -m tpu -rA \
            packages/train/tests/test_on_tpu.py > "$out.log" 2>&1; echo "exit $?"; tail -25 "$out.log" ;;
    train)  # tpu_train.py: llama-1b at seq 2048, tokens/s and MFU; BENCH_ARGS: calls separated by '|'
        local call index=0 calls
        IFS='|' read -ra calls <<< "${BENCH_ARGS:---remat save_dots --attention auto --batch-size 8 --accumulation 4 --steps 8 --timeout 150 -- --model.num_layers 8 --model.vocab_size 32000}"
        for call in "${calls[@]}"; do
            index=$((index + 1))
            if (( $(left) < 150 )); then echo "skipped ($(left) s left): $call"; continue; fi
            # shellcheck disable=SC2086  # each call is a list of arguments
            python3 benchmarks/tpu/tpu_train.py --output "$out.$index.json" $call 2>&1 | tail -8
        done ;;
    levanter)  # tpu/tpu_levanter.py: Levanter's own step (bundle .lev, LEV_SETTINGS), ratio to the train part's best
        local halyard=(--halyard) file
        for file in "$OUT_DIR"/train.*.json; do [[ -f "$file" ]] && halyard+=("$file"); done
        # shellcheck disable=SC2086  # the settings are a list
        timeout -k 5 "$t" python3 benchmarks/tpu/tpu_levanter.py --bundle "${LEV_BUNDLE:-.lev}" \
            --setting ${LEV_SETTINGS:-16,2,recompute} --budget $(( t - 10 )) "${halyard[@]}" \
            --output "$out.json" 2>&1 | tail -6; echo "exit ${PIPESTATUS[0]}" ;;
    levanter-engine)  # tpu/tpu_levanter_engine.py: Levanter's inference engine beside Halyard's, same Llama and 256 requests
        local smoke=(); [[ "$SIZE" == tpu ]] || smoke=(--cpu-smoke)  # LEV_PYTHON, LEV_SITE: a CPU's Levanter
        # shellcheck disable=SC2086  # the settings are a list
        timeout -k 5 "$t" python3 benchmarks/tpu/tpu_levanter_engine.py "${smoke[@]}" --bundle "${LEV_BUNDLE:-.lev}" \
            --levanter-python "${LEV_PYTHON:-python3}" --levanter-site "${LEV_SITE:-/tmp/lev-site}" \
            --budget $(( t - 15 )) --halyard-seconds "${HALYARD_S:-170}" --compilation-cache "$CACHE" \
            ${LEV_ENGINE_SETTINGS:+--levanter-setting $LEV_ENGINE_SETTINGS} --work-dir /tmp/levanter-engine \
            --output "$out.json" > "$out.log" 2>&1; echo "exit $?"; tail -8 "$out.log"
        cp /tmp/levanter-engine/*.log "$OUT_DIR/" 2>/dev/null ;;
    serve)  # serving/serve.py --profile tpu: 256 requests at once and at a rate, the decode step against the roofline
        timeout -k 5 "$t" python3 benchmarks/serving/serve.py --profile "$PROFILE" --phase-seconds "${PHASE_S:-25}" \
            --compilation-cache "$CACHE" --output "$out.json" 2>&1 | grep -v "compiled step shape" | tail -30
        echo "exit ${PIPESTATUS[0]}" ;;
    first-request)  # serving/serve_first_request.py: halyard serve --hf on a unix socket, start to first answer, cold and warm
        timeout -k 5 "$t" python3 benchmarks/serving/serve_first_request.py --size "$SIZE" --work /tmp/first-request \
            --limit $(( t / 2 )) --output "$out.json" > "$out.log" 2>&1; echo "exit $?"; tail -8 "$out.log"
        cp /tmp/first-request/server_*.log "$OUT_DIR/" 2>/dev/null ;;
    deterministic)  # serving/serve_deterministic.py: the deterministic promise on the chip and its cost (DET_DTYPE)
        timeout -k 5 "$t" python3 benchmarks/serving/serve_deterministic.py --size "$SIZE" \
            --dtype "${DET_DTYPE:-bfloat16}" --limit $(( t - 25 )) --output "$out.json" > "$out.log" 2>&1
        echo "exit $?"; tail -16 "$out.log" ;;
    rl)  # rl/rl_tpu.py: grpo-demo's sampler/trainer log-prob difference, a 0.5B GRPO step split per row layout (DEMO_STEPS, RL_VARIANTS, RL_CPU)
        # shellcheck disable=SC2086  # the variants and the CPU flag are lists
        timeout -k 5 "$t" python3 benchmarks/rl/rl_tpu.py --work /tmp/rl-tpu --demo-steps "${DEMO_STEPS:-10}" \
            --shapes "$SHAPE" --variants ${RL_VARIANTS:-padded packed-fast padded-fast} ${RL_CPU---cpu-too} \
            --limit $(( t - 5 )) --output "$out.json" > "$out.log" 2>&1
        echo "exit $?"; tail -12 "$out.log"; cp /tmp/rl-tpu/*.log "$OUT_DIR/" 2>/dev/null ;;
    kernel-check)  # tpu/tpu_decode_kernel_check.py: the decode kernel compiled, against the reference and JAX's kernel
        timeout -k 5 "$t" python3 benchmarks/tpu/tpu_decode_kernel_check.py > "$out.json" 2> "$out.log"
        echo "exit $?"; tail -c 3000 "$out.json"; tail -5 "$out.log" ;;
    attention)  # tpu/tpu_paged_attention.py: 128 decoding rows, ours ("decode") against JAX's ("never"), vs the roofline
        timeout -k 5 "$t" python3 benchmarks/tpu/tpu_paged_attention.py --page-size 256 --context 550 2048 \
            --no-blocked --by-token decode never --output "$out.json" > "$out.log" 2>&1
        echo "exit $?"; grep '"kernel"' "$out.log" | cut -c1-260; tail -3 "$out.log" | cut -c1-400 ;;
    decode)  # serving/serve_tpu.py --phases decode: the engine's decode step of 128 rows against the HBM roofline
        timeout -k 5 "$t" python3 benchmarks/serving/serve_tpu.py --phases decode --compilation-cache "$CACHE" \
            --output "$out.json" > "$out.log" 2>&1
        echo "exit $?"; grep -E "^decode|Error|error" "$out.log" | tail -5 | cut -c1-700 ;;
    kernel-parts)  # probes/tpu_decode_kernel_parts.py: the token decode kernel whole, copies only, arithmetic only
        timeout -k 5 "$t" python3 benchmarks/probes/tpu_decode_kernel_parts.py > "$out.log" 2>&1
        echo "exit $?"; grep '"part"' "$out.log" ;;
    start-phases)  # probes/serve_start_phases.py: where a start of halyard serve goes, cold and warm
        timeout -k 5 "$t" python3 benchmarks/probes/serve_start_phases.py --size "$SIZE" --work /tmp/phases \
            --output "$out.json" > "$out.log" 2>&1; echo "exit $?"; tail -c 2500 "$out.json" 2>/dev/null ;;
    engine-small)  # serving/serve.py --profile tpu-small: the tiny engine's warm-up on padding, then 24 requests
        timeout -k 5 "$t" python3 benchmarks/serving/serve.py --profile tpu-small --phases at_once \
            --phase-seconds 20 --output "$out.json" 2>&1 | tail -14; echo "exit ${PIPESTATUS[0]}" ;;
    kernel-tests)  # the paged attention kernels' on-chip tests against their reference (pytest -m tpu)
        HALYARD_TEST_TPU=1 timeout -k 5 "$t" python3 -m pytest -q -p no:cacheprovider -m tpu \
            packages/models/tests/test_ragged_paged_pallas.py > "$out.log" 2>&1; echo "exit $?"; tail -15 "$out.log" ;;
    esac
}

for name in "${PARTS[@]}"; do
    t=$(share "$name")
    echo; echo "=== $name (at $(elapsed) s, $(date -u +%H:%M:%S) UTC, $t s)"
    if (( t > 0 )); then run_part "$name" "$t"; else echo "skipped: $(left) s left"; fi
done
echo; echo "=== done (at $(elapsed) s)"; ls -la "$OUT_DIR"
