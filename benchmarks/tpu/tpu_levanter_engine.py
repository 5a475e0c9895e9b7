"""Halyard's serving engine beside Levanter's own (``levanter.inference``: paged KV, its ``generate`` loop) on the
same chip, model, weights and requests: output tokens/s, time to first token, and Halyard / Levanter.

The model: a Llama of Qwen2.5-0.5B's sizes (24 layers, hidden 896, 14 heads of 64 on 2 KV heads, MLP 4864,
vocabulary 151,936, tied, RoPE theta 1e6; Levanter's engine runs Llama-family models, not Qwen2's biased
projections), random weights written once as a Hugging Face folder in bfloat16 (``--cpu-smoke``: a two-layer
one in float32). The requests: serve_tpu.py's ``at_once`` set, 256 requests of prompts 64-1024 tokens and
64-512 new tokens (seed ``--seed``), all arriving at once, greedy, each run to its length. This process stays
off the accelerator (``JAX_PLATFORMS=cpu``: one process holds a TPU chip); each engine runs in a process of its
own, one after the other, loading the same folder and the same request list:

- Levanter: `levanter_engine_arm.py` with Levanter's packages (the bundle ``--bundle``, installed by its
  install.sh into ``--levanter-site``) on the path and Halyard's taken off it, once per ``--levanter-setting``
  (what it does with the requests, and why: its docstring), in what ``--budget`` leaves after
  ``--halyard-seconds``;
- Halyard: ``halyard.serve.Engine`` with serve_tpu.py's ``tpu`` sizes (pages of 256, 128 running rows, chunks of
  256, start-up warm-up), a warm-up request pair, then ``run_arrivals`` as serve_tpu.py's ``at_once`` phase
  times it.

Written after each engine (``--output``): both rows, the best Levanter setting, Halyard / Levanter output
tokens/s and time to first token p50 / p90, how many requests began with the same tokens in both (the same
weights read the same way), the request set, the date, and each process's JAX and package versions.

    python3 benchmarks/tpu/tpu_levanter_engine.py --bundle .lev                   # on the TPU machine
    python3 benchmarks/tpu/tpu_levanter_engine.py --cpu-smoke --levanter-python /tmp/lev-venv/bin/python \\
        --levanter-site /tmp/lev-site-cpu --bundle .lev                          # a CPU, a minute or two
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.metadata
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "tpu_levanter_engine.json"
sys.path.insert(0, str(ROOT / "benchmarks" / "serving"))
_ACCELERATOR_ENV = dict(os.environ)
"""The engines' environment: this process's as it started (it then keeps its own JAX on the CPU)."""
LEVANTER_QUIET = dict(
    WANDB_MODE="disabled", WANDB_SILENT="true", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
    HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
)  # fmt: skip
"""What the bundle's run.sh sets for Levanter: no tracker, no network."""
QWEN_CONFIG = ROOT / "packages/export/tests/fixtures/hf-configs/qwen2/Qwen2.5-0.5B.json"
SMOKE_LLAMA = dict(
    vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=256,
)  # fmt: skip


def llama_hf_config(smoke: bool) -> dict[str, Any]:
    """Qwen2.5-0.5B's config.json as a Llama's (the same sizes and RoPE; no biases), or a tiny Llama's."""
    qwen = json.loads(QWEN_CONFIG.read_text())
    kept = ("hidden_act", "hidden_size", "intermediate_size", "max_position_embeddings", "num_attention_heads",
            "num_hidden_layers", "num_key_value_heads", "rms_norm_eps", "rope_theta", "tie_word_embeddings",
            "vocab_size")  # fmt: skip
    hf = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **{key: qwen[key] for key in kept}}
    return hf | SMOKE_LLAMA if smoke else hf


def write_inputs(args: argparse.Namespace) -> tuple[Path, Path, dict[str, Any]]:
    """The model folder (written once) and the request list both engines read; the request set's description."""
    from serve_first_request import write_random_model
    from serve_tpu import SIZES, requests_of

    from halyard.export.config_reading import config_from_hf_dict

    folder = args.work_dir / ("model-smoke" if args.cpu_smoke else "model")
    hf = llama_hf_config(args.cpu_smoke)
    if not (folder / "config.json").is_file():
        config, _ = config_from_hf_dict(hf, overrides={"param_dtype": args.dtype})
        write_random_model(folder, config, dtype=args.dtype)
    size = SIZES[args.size]
    if args.requests is not None:
        size = dataclasses.replace(size, requests=args.requests)
    requests = requests_of(size, hf["vocab_size"], args.seed)
    request_file = args.work_dir / f"requests-{args.size}-{len(requests)}-{args.seed}.json"
    request_file.write_text(json.dumps(requests))
    described = dict(
        requests=len(requests), arrival="all at once", prompt_tokens=[size.prompt_range[0], size.prompt_range[1] - 1],
        new_tokens=[size.output_range[0], size.output_range[1] - 1], seed=args.seed, prompt_tokens_total=sum(len(p) for p, _ in requests),
        output_tokens_total=sum(n for _, n in requests), sampling="greedy, every request to its length",
        model=dict(hf, dtype=args.dtype, weights="random (halyard.models.init_model, key 0)"),
    )  # fmt: skip
    return folder, request_file, described


def run_halyard(args: argparse.Namespace) -> int:
    """The Halyard arm (this file with ``--arm halyard``, on the accelerator): engine, warm-up, the requests."""
    import jax
    from serve_tpu import SIZES, engine_config, run_arrivals

    from halyard.export import import_hf
    from halyard.serve import Engine

    size = SIZES[args.size]
    started = time.perf_counter()
    _, model = import_hf(args.folder, dtype=args.dtype)
    loaded = time.perf_counter() - started
    engine = Engine(
        model,
        engine_config(**size.engine, warmup=not args.cpu_smoke, compilation_cache=args.compilation_cache),
    )
    built = time.perf_counter() - started - loaded
    requests = [(list(prompt), int(count)) for prompt, count in json.loads(args.request_file.read_text())]
    # A pair of small requests, as Levanter's warm-up; the smoke's engine compiles each shape at first use, so
    # there the whole set once.
    warmup = requests if args.cpu_smoke else [(prompt[:8], 2) for prompt, _ in requests[:2]]
    run_arrivals(engine, warmup, None, args.budget)
    phase = run_arrivals(engine, requests, None, args.budget, keep=args.keep_tokens)
    row = dict(
        setting="serve_tpu.py's " + args.size, status="ok" if phase["finished"] == len(requests) else "truncated",
        engine_config={k: str(v) for k, v in dataclasses.asdict(engine.config).items()}, load_seconds=loaded,
        engine_seconds=built, **phase,
    )  # fmt: skip
    versions = {name: importlib.metadata.version(name) for name in ("jax", "jaxlib")}
    result = dict(engine="halyard.serve.Engine", versions=versions, backend=jax.default_backend(),
                  device=str(jax.devices()[0].device_kind), rows=[row])  # fmt: skip
    args.output.write_text(json.dumps(result, indent=1))
    print("halyard", json.dumps({k: v for k, v in row.items() if k not in ("first_tokens", "engine_config")}))
    return 0 if row["status"] == "ok" else 1


def arm_process(
    name: str, command: list[str], env: dict[str, str], seconds: float, log: Path
) -> dict[str, Any]:
    """Run an arm's process (its output in ``log``); its JSON, or a row saying why there is none."""
    output = Path(command[command.index("--output") + 1])
    output.unlink(missing_ok=True)
    began = time.perf_counter()
    code: int | str
    with log.open("w") as sink:
        try:
            code = subprocess.run(
                command, env=env, stdout=sink, stderr=subprocess.STDOUT, timeout=seconds
            ).returncode
        except subprocess.TimeoutExpired:
            code = f"timed out after {seconds:.0f} s"
    result = json.loads(output.read_text()) if output.is_file() else {"rows": []}
    result["process_seconds"] = time.perf_counter() - began
    if code != 0:
        tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-3:])
        result["status"] = f"{name}: exit {code}: {tail}"[:600]
        print(result["status"], flush=True)
    return result


def levanter_env(args: argparse.Namespace) -> dict[str, str] | str:
    """The Levanter arm's environment once the bundle is installed in ``--levanter-site``; or why not."""
    from tpu_levanter import levanter_environment

    env = levanter_environment(args.halyard_target, _ACCELERATOR_ENV) | LEVANTER_QUIET
    install = {**env, "LEV_SITE": str(args.levanter_site), "PYTHON": args.levanter_python}
    log = args.work_dir / "levanter-install.log"
    if str(args.bundle) != "none":
        with log.open("w") as sink:
            script = ["bash", str(args.bundle / "install.sh")]
            code = subprocess.run(script, env=install, stdout=sink, stderr=sink).returncode
        if code != 0:
            return f"install failed (exit {code}): {log}"
    env["PYTHONPATH"] = ":".join(p for p in (env.get("PYTHONPATH", ""), str(args.levanter_site)) if p)
    return env


def best(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    ran = [row for row in rows if row.get("status") == "ok"]
    return max(ran, key=lambda row: row["output_tokens_per_second"]) if ran else None


def compare(halyard: dict[str, Any] | None, levanter: dict[str, Any] | None) -> dict[str, Any]:
    """Halyard / Levanter: output tokens/s, time to first token; requests that began with the same tokens."""
    if halyard is None or levanter is None:
        return {"status": "an engine has no completed run"}
    pairs = list(zip(halyard["first_tokens"], levanter["first_tokens"]))
    return dict(
        halyard_over_levanter_output_tokens_per_second=halyard["output_tokens_per_second"]
        / levanter["output_tokens_per_second"],
        levanter_over_halyard_ttft_p50=levanter["ttft_p50"] / halyard["ttft_p50"],
        levanter_over_halyard_ttft_p90=levanter["ttft_p90"] / halyard["ttft_p90"],
        same_first_token=sum(h[:1] == v[:1] for h, v in pairs) / max(len(pairs), 1),
        same_kept_tokens=sum(h == v for h, v in pairs) / max(len(pairs), 1),
        levanter_setting=levanter["setting"],
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cpu-smoke", action="store_true", help="a tiny float32 Llama, 8 small requests, a CPU"
    )
    parser.add_argument("--bundle", type=Path, default=Path(".lev"),
                        help="the Levanter bundle (make_bundle.sh), installed into --levanter-site; none: that "
                        "folder holds Levanter already")  # fmt: skip
    parser.add_argument(
        "--levanter-site", type=Path, default=Path("/tmp/lev-site"), help="install.sh's LEV_SITE"
    )
    parser.add_argument("--levanter-python", default="python3", help="the interpreter Levanter runs under")
    parser.add_argument("--levanter-setting", nargs="+", default=None,
                        help="PREFILL_TOKENS,SEQS,PAGE[,ROUNDS] per Levanter engine (levanter_engine_arm.py)")  # fmt: skip
    parser.add_argument("--requests", type=int, default=None, help="how many requests (default 256; smoke 8)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--budget", type=float, default=540, help="seconds for all: the model written, both engines"
    )
    parser.add_argument(
        "--halyard-seconds", type=float, default=170, help="of the budget, Halyard's process (run last)"
    )
    parser.add_argument("--keep-tokens", type=int, default=8, help="tokens compared per request")
    parser.add_argument("--compilation-cache", default=None, help="Halyard's EngineConfig.compilation_cache")
    parser.add_argument("--halyard-target", default="/tmp/halyard", help="tools/tpu_install.py's --target")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/levanter-engine"))
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--arm", choices=["halyard"], help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--request-file", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--size", default="tpu", help=argparse.SUPPRESS)
    parser.add_argument("--dtype", default="bfloat16", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.arm == "halyard":
        return run_halyard(args)
    if args.cpu_smoke:  # the Halyard engine compiles at first use, not every shape at its start
        args.size, args.dtype = "small", "float32"
        args.requests = args.requests or 8
    if str(args.bundle) != "none" and not (args.bundle / "install.sh").is_file():
        parser.error(
            f"--bundle: no {args.bundle}/install.sh: build it with bash ../shared/levanter/make_bundle.sh {args.bundle}"
        )
    settings = args.levanter_setting or (["256,8,32"] if args.cpu_smoke else ["16384,64,128", "8192,32,128"])
    started = time.perf_counter()  # the budget counts from here: the model's writing included
    os.environ["JAX_PLATFORMS"] = "cpu"  # before JAX starts here: the engines' processes need the chip
    args.work_dir.mkdir(parents=True, exist_ok=True)
    folder, request_file, described = write_inputs(args)
    command = " ".join(
        ["python3", "benchmarks/tpu/tpu_levanter_engine.py", *(sys.argv[1:] if argv is None else argv)]
    )
    result: dict[str, Any] = dict(
        benchmark="tpu_levanter_engine", date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        command=command, request_set=described,
    )  # fmt: skip

    def write() -> None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=1) + "\n")

    smoke = ["--cpu-smoke"] if args.cpu_smoke else []
    common = ["--folder", str(folder), "--dtype", args.dtype, "--keep-tokens", str(args.keep_tokens)]
    halyard_command = [sys.executable, str(Path(__file__).resolve()), "--arm", "halyard", *smoke, "--size", args.size,
                       "--request-file", str(request_file), "--budget", str(args.halyard_seconds), *common,
                       "--output", str(args.work_dir / "halyard.json")]  # fmt: skip
    if args.compilation_cache:
        halyard_command += ["--compilation-cache", args.compilation_cache]
    env = levanter_env(args)  # Levanter first: Halyard keeps its own share of the budget
    if isinstance(env, str):
        result["levanter"] = {"status": env, "rows": []}
    else:
        max_seq_len = 64 if args.cpu_smoke else 1536  # serve_tpu.py's max_context
        levanter_command = [args.levanter_python, str(HERE / "levanter_engine_arm.py"), "--requests",
                            str(request_file), "--setting", *settings, "--max-seq-len", str(max_seq_len), *common,
                            "--output", str(args.work_dir / "levanter.json")]  # fmt: skip
        left = args.budget - (time.perf_counter() - started) - args.halyard_seconds
        result["levanter"] = arm_process(
            "levanter", levanter_command, env, left, args.work_dir / "levanter.log"
        )
    write()
    left = min(args.halyard_seconds, args.budget - (time.perf_counter() - started))
    result["halyard"] = arm_process(
        "halyard", halyard_command, _ACCELERATOR_ENV, left, args.work_dir / "halyard.log"
    )
    halyard, levanter = best(result["halyard"]["rows"]), best(result["levanter"]["rows"])
    result["versus"] = compare(halyard, levanter)
    write()
    for name, row in (("halyard", halyard), ("levanter", levanter)):
        if row is not None:
            print(f"{name} ({row['setting']}): {row['output_tokens_per_second']:,.0f} output tokens/s, "
                  f"TTFT p50 {row['ttft_p50']:.2f} s, p90 {row['ttft_p90']:.2f} s")  # fmt: skip
    ratio = result["versus"].get("halyard_over_levanter_output_tokens_per_second")
    if ratio is not None:
        print(f"Halyard / Levanter output tokens/s: {ratio:.3f}x; same first token in "
              f"{result['versus']['same_first_token']:.0%} of requests")  # fmt: skip
    return 0 if ratio is not None else 1


if __name__ == "__main__":
    sys.exit(main())
