"""Levanter's own inference engine (``levanter.inference.InferenceEngine``) on a request set: output tokens/s and
time to first token. Run by `tpu_levanter_engine.py` in a process of its own, with Levanter's packages on the
path and none of Halyard's (this file imports only Levanter, JAX and the standard library).

The model: the Hugging Face Llama folder the parent wrote, read by Levanter's own converter
(``HFCheckpointConverter.load_pretrained``) in ``--dtype``. The requests (``--requests``: a JSON list of
``[prompt_ids, new_tokens]``) all arrive at once. Levanter's engine serves a list of requests per
``generate`` call: one prefill of all of them (at most ``max_seqs_in_prefill`` sequences whose prompts total at
most ``max_prefill_size`` tokens; the rest of a longer list is never admitted), then decode rounds until every
one has its tokens, then the next call starts empty. So the requests go in arrival order into the largest
groups one prefill takes, as Levanter's OpenAI server groups what it has queued, and each group is one
``generate``. A request's first token is there when its group's prefill has been read back (the engine's
``step_callback`` runs then, before the first decode round); its time counts from the common arrival.

Each ``--setting`` is ``PREFILL_TOKENS,SEQS,PAGE_SIZE[,ROUNDS]`` (``max_prefill_size``; ``max_seqs`` =
``max_seqs_in_prefill``; ``page_size``; ``max_rounds``, decode steps per device call, default 32); the KV pool
holds every sequence at ``--max-seq-len``. Greedy, no stop tokens (every request runs to its length), a
tokenizer stand-in that decodes nothing (the engine decodes each finished sequence's text for its debug log).
Before the timed run, two small ``generate`` calls compile the setting's programs (the decode loop in the
first; the prefill in both: the second call's state, left by the first, is placed otherwise than a new one's).

    python3 benchmarks/tpu/levanter_engine_arm.py --folder F --requests R.json --setting 16384,64,128 --output O.json
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib.metadata
import json
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any


class SilentTokenizer:
    """What the engine asks of a tokenizer (``decode``, for its log of finished text), decoding nothing."""

    def decode(self, ids: Any, skip_special_tokens: bool = False) -> str:
        return ""


def load_model(folder: Path, dtype: str, trainer: Any) -> Any:
    """The folder's Llama model through Levanter's Hugging Face converter, parameters in ``dtype``, placed by
    ``trainer`` (a `TrainerConfig`) as levanter.main.sample_lm places it."""
    import jax.numpy as jnp
    from levanter.compat.hf_checkpoints import HFCheckpointConverter
    from levanter.models.llama import LlamaConfig

    converter = HFCheckpointConverter(LlamaConfig, reference_checkpoint=str(folder), tokenizer=str(folder))
    config = converter.config_from_hf_config(converter.hf_config_from_hf_checkpoint(str(folder)))
    return converter.load_pretrained(
        config.model_type, ref=str(folder), config=config, axis_mapping=trainer.parameter_axis_mapping,
        dtype=jnp.dtype(dtype),
    )  # fmt: skip


def groups_of(requests: list[tuple[list[int], int]], prefill_tokens: int, seqs: int) -> list[list[int]]:
    """Request indices in arrival order, cut into the largest groups one prefill admits."""
    groups: list[list[int]] = [[]]
    used = 0
    for index, (prompt, _) in enumerate(requests):
        if len(prompt) > prefill_tokens:
            raise ValueError(f"a prompt of {len(prompt)} tokens exceeds max_prefill_size {prefill_tokens}")
        if len(groups[-1]) == seqs or used + len(prompt) > prefill_tokens:
            groups.append([])
            used = 0
        groups[-1].append(index)
        used += len(prompt)
    return groups


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[int(fraction * (len(ordered) - 1))] if ordered else float("nan")


class Arm:
    """One engine of one setting over the model."""

    def __init__(self, model: Any, setting: str, max_seq_len: int, trainer: Any):
        import jax.numpy as jnp
        from levanter.inference.engine import InferenceEngine, InferenceEngineConfig

        prefill, seqs, page, *rounds = (int(part) for part in setting.split(","))
        pages_per_seq = -(-max_seq_len // page)
        self.config = InferenceEngineConfig(
            max_seq_len=max_seq_len, page_size=page, max_seqs=seqs, max_seqs_in_prefill=seqs,
            max_prefill_size=prefill, max_pages=seqs * pages_per_seq, max_rounds=rounds[0] if rounds else 32,
            max_queued_tokens=max(512, seqs), max_stop_seqs=0, max_stop_tokens=0, compute_dtype=jnp.bfloat16,
        )  # fmt: skip
        self.engine = InferenceEngine.from_model_with_config(
            model, SilentTokenizer(), self.config, axis_resources=trainer.compute_axis_mapping
        )

    def run(
        self, requests: list[tuple[list[int], int]], keep: int
    ) -> tuple[dict[int, float], dict[int, list[int]], float]:
        """Every request through ``generate`` in prefill-sized groups: each one's first-token time, its
        tokens, and the seconds in all."""
        import jax
        import jax.numpy as jnp
        from levanter.inference.engine import Request
        from levanter.inference.jit_scheduler import SeqDecodingParams

        first: dict[int, float] = {}
        tokens: dict[int, list[int]] = {}
        started = time.perf_counter()
        for group in groups_of(requests, self.config.max_prefill_size or 0, self.config.max_seqs):
            batch = [
                Request(
                    prompt_tokens=requests[i][0], request_id=i, n_generations=1,
                    decode_params=SeqDecodingParams(
                        max_num_tokens=jnp.array(len(requests[i][0]) + requests[i][1], dtype=jnp.int32),
                        stop_tokens=None, temperature=jnp.array(0.0, dtype=jnp.float32),
                        top_p=jnp.array(1.0, dtype=jnp.float32), key=jax.random.PRNGKey(i),
                    ),
                )
                for i in group
            ]  # fmt: skip

            def note_first(_iteration: int, group: list[int] = group) -> None:
                now = time.perf_counter() - started
                for i in group:
                    outputs = self.engine.results.get(i, {}).get(0)
                    if i not in first and outputs is not None and outputs.token_list:
                        first[i] = now

            result = self.engine.generate(batch, step_callback=note_first)
            note_first(-1)  # a group done before its first decode round
            for i, produced in zip(group, result.tokens):
                tokens[i] = produced[:keep] if keep else produced
                if len(produced) != requests[i][1]:
                    raise RuntimeError(f"request {i}: {len(produced)} tokens, asked {requests[i][1]}")
        return first, tokens, time.perf_counter() - started


def run_setting(
    model: Any, setting: str, requests: list[tuple[list[int], int]], args: argparse.Namespace, trainer: Any
) -> dict:
    """A setting's row: warm-up, then every request timed."""
    import jax

    began = time.perf_counter()
    arm = Arm(model, setting, args.max_seq_len, trainer)
    built = time.perf_counter() - began
    warm = []
    with warnings.catch_warnings(record=True) as caught:  # the engine's word when its TPU kernel fails
        warnings.simplefilter("always")
        for _ in range(2):  # the second compiles the prefill again, for the state the first left
            warm.append(arm.run([(prompt[:8], 2) for prompt, _ in requests[:2]], keep=0)[2])
        first, tokens, seconds = arm.run(requests, keep=args.keep_tokens)
    fell_back = any("ragged paged attention failed" in str(warning.message) for warning in caught)
    on_tpu = jax.default_backend() == "tpu" and not fell_back
    attention = "JAX's TPU ragged paged attention kernel" if on_tpu else "Levanter's reference (jnp)"
    produced = sum(count for _, count in requests)
    ttft = list(first.values())
    row = dict(
        setting=setting, status="ok", engine_config={k: str(v) for k, v in dataclasses.asdict(arm.config).items()},
        groups=len(groups_of(requests, arm.config.max_prefill_size or 0, arm.config.max_seqs)),
        attention=attention, engine_seconds=built, warmup_seconds=warm, seconds=seconds, output_tokens=produced,
        output_tokens_per_second=produced / seconds, ttft_p50=percentile(ttft, 0.5), ttft_p90=percentile(ttft, 0.9),
        first_tokens=[tokens[i] for i in range(len(requests))],
    )  # fmt: skip
    del arm
    gc.collect()
    return row


def versions() -> dict[str, str]:
    names = ["jax", "jaxlib", "marin-levanter", "marin-haliax", "equinox"]
    return {name: importlib.metadata.version(name) for name in names}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, required=True, help="the Hugging Face Llama folder")
    parser.add_argument("--requests", type=Path, required=True, help="JSON list of [prompt ids, new tokens]")
    parser.add_argument(
        "--setting", nargs="+", default=["16384,64,128"], help="PREFILL_TOKENS,SEQS,PAGE[,ROUNDS]"
    )
    parser.add_argument("--max-seq-len", type=int, default=1536, help="the longest prompt + output")
    parser.add_argument("--dtype", default="bfloat16", help="the parameters' dtype")
    parser.add_argument("--keep-tokens", type=int, default=8, help="output tokens kept per request (0: all)")
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    import jax
    from levanter.trainer import TrainerConfig

    result: dict[str, Any] = dict(
        engine="levanter.inference.InferenceEngine", versions=versions(), backend=jax.default_backend(),
        device=str(jax.devices()[0].device_kind), rows=[],
    )  # fmt: skip
    result["import_seconds"] = time.perf_counter() - started
    requests = [(list(prompt), int(count)) for prompt, count in json.loads(args.requests.read_text())]
    trainer = TrainerConfig()
    with trainer.use_device_mesh():
        loading = time.perf_counter()
        model = load_model(args.folder, args.dtype, trainer)
        result["load_seconds"] = time.perf_counter() - loading
        for setting in args.setting:
            run_and_write(model, setting, requests, args, trainer, result)
    return 0 if any(row["status"] == "ok" for row in result["rows"]) else 1


def run_and_write(
    model: Any, setting: str, requests: list[tuple[list[int], int]], args: argparse.Namespace, trainer: Any,
    result: dict[str, Any],
) -> None:  # fmt: skip
    """A setting's row (or why it failed) added to ``result``, written to ``args.output``."""
    try:
        row = run_setting(model, setting, requests, args, trainer)
    except Exception as error:  # a setting that fails (out of memory...) is a row; the next one runs
        traceback.print_exc()
        row = dict(setting=setting, status=f"failed: {type(error).__name__}: {error}"[:400])
    result["rows"].append(row)
    shown = {k: v for k, v in row.items() if k not in ("first_tokens", "engine_config")}
    print("levanter", json.dumps(shown), flush=True)
    args.output.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    sys.exit(main())
