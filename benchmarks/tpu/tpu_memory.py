"""Llama-3.2-1B on one TPU chip: the splash kernel against XLA's attention, the compiled step's memory against
`halyard plan`'s prediction, and a short training run per memory setting (tokens/s, MFU as `train` logs them).

    python benchmarks/tpu/tpu_memory.py --out DIR                 # on the TPU machine: every section
    python benchmarks/tpu/tpu_memory.py --out DIR --only attention memory

Sections (each writes ``DIR/<section>.json`` and prints a table):

- ``attention``: batch 2 x 2048 tokens, 32 heads over 8 KV heads of 64, bfloat16, fwd+bwd: the largest error
  of ``splash`` and of ``xla`` (or ``blocked`` where ``xla`` cannot cap logits) against ``reference`` run in
  float32, for causal attention over packed documents and for a sliding window with Gemma 2's soft-cap;
  the time of one fwd+bwd of each.
- ``memory``: for each setting in `SETTINGS`, the train step compiled for the TPU (XLA's memory analysis,
  `halyard.train.plan.step_memory`) beside `halyard plan`'s prediction, compiled in a CPU process
  (``JAX_PLATFORMS=cpu``, traced as for the TPU) started at the same time.
- ``train``: ``train --config llama-1b`` for `--steps` steps per setting that fits, on the built-in
  python-stdlib corpus (tokenizer of 32,000 tokens; the model keeps its 128,256), reading tokens/s and MFU
  from the run's metrics.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BASE = ["--config", "llama-1b", "--data.seq_len", "2048", "--trainer.mesh.fsdp", "1"]
EXTRA_ENV = "TPU_MEMORY_EXTRA"
SETTINGS_ENV = "TPU_MEMORY_SETTINGS"
"""The settings the run measures, as JSON (set from --settings for the children)."""
"""Overrides appended to every setting (``--smoke`` shrinks the model with them, to try the script on CPU)."""
SMOKE = [
    "--model.num_layers", "1", "--model.hidden_size", "128", "--model.intermediate_size", "256",
    "--model.num_heads", "4", "--model.num_kv_heads", "2", "--model.head_dim", "32", "--model.vocab_size", "4096",
    "--data.tokenizer_vocab_size", "4096", "--data.seq_len", "256", "--data.max_documents", "200",
]  # fmt: skip
SETTINGS: dict[str, list[str]] = {
    "bf16_weights_f32_adam_offload_save_attention_b8": [
        "--model.param_dtype", "bfloat16", "--model.optimizer_dtype", "float32",
        "--trainer.offload_optimizer_state", "true", "--model.remat", "save_attention", "--trainer.batch_size", "8",
    ],
    "bf16_weights_f32_adam_full_b2": [
        "--model.param_dtype", "bfloat16", "--model.optimizer_dtype", "float32",
        "--model.remat", "full", "--trainer.batch_size", "2",
    ],
    "bf16_weights_f32_adam_full_b1": [
        "--model.param_dtype", "bfloat16", "--model.optimizer_dtype", "float32",
        "--model.remat", "full", "--trainer.batch_size", "1",
    ],
    "bf16_weights_f32_adam_offload_full_b8_acc4": [
        "--model.param_dtype", "bfloat16", "--model.optimizer_dtype", "float32",
        "--trainer.offload_optimizer_state", "true", "--model.remat", "full", "--trainer.batch_size", "8",
        "--trainer.accumulation", "4",
    ],
    "bf16_weights_bf16_adam_save_dots_b8_acc8": [
        "--model.param_dtype", "bfloat16", "--model.optimizer_dtype", "bfloat16",
        "--model.remat", "save_dots", "--trainer.batch_size", "8", "--trainer.accumulation", "8",
    ],
    "f32_weights_offload_full_b4": [
        "--trainer.offload_optimizer_state", "true", "--model.remat", "full", "--trainer.batch_size", "4",
    ],
    # TPU.md's 552M cut of the 1B model (8 layers, vocabulary 32,000), which fits: splash (auto) against xla.
    "8_layers_vocab_32k_b8_acc4_splash": [
        "--model.num_layers", "8", "--model.vocab_size", "32000", "--trainer.batch_size", "8",
        "--trainer.accumulation", "4",
    ],
    "8_layers_vocab_32k_b8_acc4_xla": [
        "--model.num_layers", "8", "--model.vocab_size", "32000", "--trainer.batch_size", "8",
        "--trainer.accumulation", "4", "--model.attention_implementation", "xla",
    ],
}  # fmt: skip
"""Memory settings of the 1B model at seq 2048 (each a list of `train` overrides)."""
DEFAULT_SETTINGS = list(SETTINGS)[:3]
"""What a run measures unless --settings names others: the whole 1B model's three settings."""
DATA = [
    "--data.builtin_corpus", "python-stdlib", "--data.tokenizer_vocab_size", "32000",
    "--data.validation_fraction", "0", "--trainer.log_every", "5", "--trainer.progress", "false",
    "--trainer.plot", "false", "--checkpoint.every_steps", "null", "--checkpoint.every_seconds", "null",
    "--trainer.eval_every", "0",
]  # fmt: skip
GIB = 2**30


def _config(overrides: list[str]) -> Any:
    from halyard.train.builtin_configs import resolve_config_paths
    from halyard.train.config.parse import parse_config
    from halyard.train.run_config import TrainConfig

    extra = json.loads(os.environ.get(EXTRA_ENV, "[]"))
    return parse_config(TrainConfig, resolve_config_paths([*BASE, *overrides, *extra]), prog="tpu_memory")


def _memory_record(memory: Any) -> dict[str, float]:
    return {
        "total_gib": memory.total / GIB,
        "arguments_gib": memory.arguments / GIB,
        "temporaries_gib": memory.temporaries / GIB,
        "outputs_not_aliased_gib": memory.outputs_not_aliased / GIB,
        "params_gib": memory.params / GIB,
        "optimizer_state_gib": memory.optimizer_state / GIB,
        "compile_seconds": memory.compile_seconds,
    }


def predict(name: str) -> dict[str, float]:
    """`halyard plan`'s figures for setting ``name`` (run with ``JAX_PLATFORMS=cpu``)."""
    import jax

    from halyard.train.plan.step_memory import step_memory

    return _memory_record(step_memory(_config(SETTINGS[name]), jax.devices()[:1], "tpu"))


def measure_memory() -> dict[str, Any]:
    """Each setting's step compiled on this machine's accelerator."""
    import jax

    from halyard.train.plan.step_memory import step_memory

    results: dict[str, Any] = {}
    for name in json.loads(os.environ.get(SETTINGS_ENV, json.dumps(DEFAULT_SETTINGS))):
        overrides = SETTINGS[name]
        started = time.perf_counter()
        try:
            compiled = step_memory(_config(overrides), jax.devices()[:1])
            measured: dict[str, Any] = _memory_record(compiled)
        except Exception as error:  # an out-of-memory compile is a result too
            measured = {"error": f"{type(error).__name__}: {str(error)[:400]}"}
        measured["seconds"] = time.perf_counter() - started
        results[name] = measured
        print(f"{name:42s} tpu {json.dumps(measured)}", flush=True)
    return results


def check_attention() -> dict[str, Any]:
    """Splash vs XLA (or blocked) against float32 reference, values and gradients, bf16 inputs."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from halyard.models.attention import AttentionMask, attention
    from halyard.named import named

    batch, heads, kv_heads, size = 2, 32, 8, 64
    length = 256 if os.environ.get(EXTRA_ENV) else 2048
    keys = jax.random.split(jax.random.key(0), 4)
    arrays = [
        jax.random.normal(keys[0], (batch, length, heads, size)),
        jax.random.normal(keys[1], (batch, length, kv_heads, size)),
        jax.random.normal(keys[2], (batch, length, kv_heads, size)),
    ]
    cotangent = jax.random.normal(keys[3], (batch, length, heads, size))
    segments = np.zeros((batch, length), np.int32)
    segments[0, length // 3 :] = 1
    segments[0, 3 * length // 4 :] = 2
    cases = {
        "causal_packed_gqa": ({"segment_ids": named(jnp.asarray(segments), ("batch", "pos"))}, None, "xla"),
        "window_quarter_softcap30_gqa": ({"sliding_window": length // 4}, 30.0, "blocked"),
    }
    axes = [("batch", "pos", "heads", "head_size"), *[("batch", "key_pos", "kv_heads", "head_size")] * 2]
    results: dict[str, Any] = {}
    for case, (mask_fields, softcap, other) in cases.items():
        mask = AttentionMask(causal=True, **mask_fields)

        def run(implementation: str, dtype: Any, mask: Any = mask, softcap: Any = softcap) -> Any:
            def output_and_grads(*inputs: jax.Array) -> Any:
                def forward(*inputs: jax.Array) -> jax.Array:
                    named_inputs = [named(x.astype(dtype), a) for x, a in zip(inputs, axes, strict=True)]
                    out = attention(*named_inputs, mask, implementation=implementation, logit_softcap=softcap)
                    return out.array.astype(jnp.float32)

                output, pullback = jax.vjp(forward, *inputs)
                return output, pullback(cotangent)

            function = jax.jit(output_and_grads)
            result = jax.block_until_ready(function(*arrays))
            started = time.perf_counter()
            for _ in range(5):
                jax.block_until_ready(function(*arrays))
            return result, (time.perf_counter() - started) / 5

        (expected, expected_grads), _ = run("reference", jnp.float32)
        results[case] = {}
        for implementation in ("splash", other):
            (output, grads), seconds = run(implementation, jnp.bfloat16)
            errors = {
                name: float(jnp.max(jnp.abs(got - want)))
                for name, got, want in zip(
                    ("output", "dquery", "dkey", "dvalue"),
                    (output, *grads),
                    (expected, *expected_grads),
                    strict=True,
                )
            }
            results[case][implementation] = {"max_abs_error": errors, "fwd_bwd_ms": seconds * 1e3}
            print(f"{case:26s} {implementation:8s} {seconds * 1e3:8.2f} ms  max |error| {errors}", flush=True)
    return results


def train(out: Path, work: Path, steps: int, fitting: list[str], deadline: float) -> dict[str, Any]:
    """``train`` for ``steps`` steps per setting, each in a child process; tokens/s and MFU from its log.
    Run folders and the token cache go under ``work``, the logs under ``out``; a setting is skipped when
    fewer than 150 s are left before ``deadline`` (a ``time.time()``)."""
    results: dict[str, Any] = {}
    for name in fitting:
        if deadline - time.time() < 150:
            results[name] = {"skipped": "too little time left"}
            continue
        run_dir = work / f"run_{name}"
        args = [
            *BASE, *SETTINGS[name], *DATA, *json.loads(os.environ.get(EXTRA_ENV, "[]")),
            "--trainer.steps", str(steps), "--trainer.run_dir", str(run_dir), "--data.cache_dir", str(work / "cache"),
        ]  # fmt: skip
        started = time.perf_counter()
        child = subprocess.run(
            [sys.executable, __file__, "--train-child", *args],
            capture_output=True,
            text=True,
            timeout=max(deadline - time.time() - 10, 30),
        )
        (out / f"train_{name}.log").write_text(child.stdout[-20000:] + child.stderr[-20000:])
        rows = []
        metrics = run_dir / "metrics.jsonl"
        if metrics.exists():
            rows = [json.loads(line) for line in metrics.read_text().splitlines()]
        logged = [row for row in rows if "tokens_per_second" in row]
        results[name] = {
            "returncode": child.returncode,
            "seconds": time.perf_counter() - started,
            "logged": [
                {k: row.get(k) for k in ("step", "loss", "tokens_per_second", "mfu")} for row in logged
            ],
            "error_tail": child.stderr[-600:] if child.returncode else "",
        }
        last = logged[-1] if logged else {}
        print(
            f"{name:42s} rc {child.returncode} tokens/s {last.get('tokens_per_second')} mfu {last.get('mfu')} "
            f"loss {last.get('loss')}",
            flush=True,
        )
    return results


def _train_child(args: list[str]) -> int:
    """`train` in a child process of its own (only one process may hold the TPU)."""
    from halyard.train.cli import train_main

    return int(train_main(args) or 0)


def _child(*args: str, **popen: Any) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, __file__, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen
    )


def _last_json(child: subprocess.Popen, timeout: float) -> dict[str, Any]:
    stdout, stderr = child.communicate(timeout=timeout)
    print(stdout, end="", flush=True)
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {"error": stderr[-1500:]}


def main() -> int:
    """The orchestrator: only one process may hold the TPU, so each part runs in a child of its own (the CPU
    predictions beside the TPU's work, with ``JAX_PLATFORMS=cpu``)."""
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command == "--train-child":
        return _train_child(sys.argv[2:])
    if command == "--predict":
        print(json.dumps(predict(sys.argv[2])), flush=True)
        return 0
    if command == "--accelerator-child":
        import jax

        result: dict[str, Any] = {"jax": jax.__version__, "device": jax.devices()[0].device_kind}
        print(result, flush=True)
        if "attention" in sys.argv[2:]:
            result["attention"] = check_attention()
        if "memory" in sys.argv[2:]:
            result["memory"] = measure_memory()
        print(json.dumps(result), flush=True)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="summary.json and the logs")
    parser.add_argument("--work", type=Path, default=Path("/tmp/tpu_memory"), help="runs and the token cache")
    parser.add_argument("--deadline-s", type=float, default=560, help="start no training run after this")
    parser.add_argument("--only", nargs="*", default=["attention", "memory", "train"])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--train-settings", nargs="*", default=None, help="default: those whose step fits")
    parser.add_argument("--smoke", action="store_true", help="a tiny model, to try the script on CPU")
    parser.add_argument("--settings", nargs="*", default=DEFAULT_SETTINGS, choices=list(SETTINGS))
    options = parser.parse_args()
    deadline = time.time() + options.deadline_s
    if options.smoke:
        os.environ[EXTRA_ENV] = json.dumps(SMOKE)
    os.environ[SETTINGS_ENV] = json.dumps(options.settings)
    options.out.mkdir(parents=True, exist_ok=True)
    predictions = {}
    if "memory" in options.only:
        env = dict(os.environ, JAX_PLATFORMS="cpu")
        predictions = {name: _child("--predict", name, env=env) for name in options.settings}
    summary: dict[str, Any] = {}
    sections = [s for s in options.only if s in ("attention", "memory")]
    if sections:
        summary = _last_json(_child("--accelerator-child", *sections), timeout=900)
    if predictions:
        measured = summary.get("memory", {})
        summary["memory"] = {}
        for name, child in predictions.items():
            planned = _last_json(child, timeout=900)
            tpu = measured.get(name, {})
            ratio = (
                planned["total_gib"] / tpu["total_gib"]
                if "total_gib" in planned and "total_gib" in tpu
                else None
            )
            summary["memory"][name] = {"tpu": tpu, "plan": planned, "plan_over_tpu": ratio}
            print(
                f"{name:42s} tpu {tpu.get('total_gib', float('nan')):6.2f} GiB  plan "
                f"{planned.get('total_gib', float('nan')):6.2f} GiB  plan/tpu {ratio}",
                flush=True,
            )
    (options.out / "summary.json").write_text(json.dumps(summary, indent=1))
    if "train" in options.only:
        fitting = options.train_settings
        if fitting is None:
            memory = summary.get("memory", {})
            fitting = [n for n, r in memory.items() if r["tpu"].get("total_gib", 99) < 15.75]
        summary["train"] = train(options.out, options.work, options.steps, fitting, deadline)
    (options.out / "summary.json").write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
