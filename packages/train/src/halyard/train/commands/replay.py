"""``halyard replay --run R --step N``: recompute step N of a run exactly, from the checkpoint before it, and
print what it was made of: its loss (with the bits the run logged), each example's loss with its documents
and offsets (worst first), and the step's per-layer statistics.

    halyard replay --run runs/demo --step 31
    halyard replay --run runs/demo --step 31 --examples 3 --statistics 'grad_norm/*'
"""

from __future__ import annotations

import argparse
import fnmatch
import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from halyard.train.data_assembly.tokenizer import load_run_tokenizer
from halyard.train.trainer.replay import Replay, ReplayedExample, replay_step

SNIPPET_CHARACTERS = 60


def parser() -> argparse.ArgumentParser:
    """The arguments of ``halyard replay``."""
    parser = argparse.ArgumentParser(prog="halyard replay", description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help="the run folder (trainer.run_dir)")
    parser.add_argument(
        "--step", required=True, type=int, help="the step to recompute (as logged: 1 is the first)"
    )
    parser.add_argument(
        "--examples", type=int, default=None, help="print only the worst N examples (default: all)"
    )
    parser.add_argument(
        "--statistics",
        default="*/layers",
        help="which per-layer statistics to print, a glob over their names (default: '*/layers', all of them)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the text")
    return parser


def replay_main(argv: Sequence[str]) -> int:
    """``halyard replay``: see the module docstring. Exits with 1 when the loss differs from the logged one."""
    args = parser().parse_args(argv)
    replay = replay_step(args.run, args.step)
    examples = replay.examples[: args.examples] if args.examples is not None else replay.examples
    if args.json:
        print(json.dumps(_as_json(replay, examples)))
    else:
        print(describe(replay, examples, args.run, args.statistics))
    return 1 if replay.same_bits is False else 0


def describe(replay: Replay, examples: list[ReplayedExample], run: str, statistics: str = "*/layers") -> str:
    """The replay as text: the loss against the logged one, the examples, the per-layer statistics."""
    lines = [
        f"step {replay.step} of {run}, recomputed from the checkpoint of step {replay.checkpoint}"
        + (
            f" (steps {replay.checkpoint + 1} to {replay.step - 1} trained again first)"
            if replay.step - replay.checkpoint > 1
            else ""
        ),
        f"loss {float(replay.loss)!r} (float32 {replay.loss.view(np.uint32):#010x}); " + _against_log(replay),
        *([replay.mesh_note] if replay.mesh_note else []),
        "",
        f"examples of the step, worst loss per counted token first ({len(examples)} of {len(replay.examples)}):",
    ]
    decode = _decoder(replay.tokenizer_path)
    for example in examples:
        where = example.position
        source = f"; source {where['source']}" if "source" in where else ""
        lines.append(
            f"  row {example.row}  loss {example.loss:.4f} over {example.tokens} tokens  (example {where.get('example')}, "
            f"window {where.get('window')}, stream token {where.get('token')}{source})"
        )
        for doc in example.documents:
            lines.append(
                f"    document {doc['document']} from token {doc['offset']} ({doc['tokens']} tokens; loss "
                f"{doc['loss']:.4f} over {doc['predicted']} predicted; {doc['source']}, its document {doc['number']}): "
                f"{decode(doc['token_ids'])!r}"
            )
    lines += ["", *_statistics_table(replay.statistics, statistics)]
    return "\n".join(lines)


def _retrained(replay: Replay) -> str:
    first, last = replay.checkpoint + 1, replay.step - 1
    if last < first:
        return ""
    return (
        f" (step {first} trained again first)"
        if first == last
        else f" (steps {first} to {last} trained again first)"
    )


def _against_log(replay: Replay) -> str:
    if replay.logged is None:
        return "the run did not log this step's loss (trainer.log_every), so there are no bits to compare"
    if replay.same_bits:
        return f"logged {replay.logged!r}: the same bits"
    return f"logged {replay.logged!r}: DIFFERENT bits (another mesh or device count than the run's?)"


def _statistics_table(statistics: dict[str, np.ndarray], pattern: str) -> list[str]:
    """One line per per-layer statistic matching ``pattern`` (its values by layer), then the scalars reported."""
    per_layer = {
        name: value
        for name, value in sorted(statistics.items())
        if name.endswith("/layers") and fnmatch.fnmatch(name, pattern)
    }
    if not statistics:
        return ["per-layer statistics: none (trainer.watch.model and trainer.watch.norms are off)"]
    lines = ["per-layer statistics of the step (layer 0 first):"]
    width = max((len(name) for name in per_layer), default=0)
    for name, value in per_layer.items():
        shown = (
            "  ".join(_number(v) for v in value)
            if value.ndim == 1
            else "  ".join(str(np.round(v, 4).tolist()) for v in value)
        )
        lines.append(f"  {name:{width}s}  {shown}")
    scalars = {
        name: value
        for name, value in statistics.items()
        if np.ndim(value) == 0
        and "/" in name
        and not name.startswith(("grad_norm/", "param_norm/", "update_norm/", "opt_state_norm/"))
    }
    if scalars:
        lines.append("  " + ", ".join(f"{name} {_number(value)}" for name, value in sorted(scalars.items())))
    return lines


def _number(value: Any) -> str:
    return f"{float(value):.4g}"


def _decoder(tokenizer_path: str) -> Callable[[list[int]], str]:
    """``token ids -> text`` with the run's tokenizer, the first `SNIPPET_CHARACTERS` characters."""
    tokenizer = load_run_tokenizer(tokenizer_path)
    return lambda ids: tokenizer.decode(ids)[:SNIPPET_CHARACTERS]


def _as_json(replay: Replay, examples: list[ReplayedExample]) -> dict:
    return {
        "step": replay.step,
        "checkpoint": replay.checkpoint,
        "loss": float(replay.loss),
        "logged": replay.logged,
        "same_bits": replay.same_bits,
        "examples": [
            {
                "row": e.row,
                "loss": e.loss,
                "tokens": e.tokens,
                **{k: v for k, v in e.position.items() if k != "documents"},
                "documents": [{k: v for k, v in d.items() if k != "token_ids"} for d in e.documents],
            }
            for e in examples
        ],
        "statistics": {name: np.asarray(value).tolist() for name, value in replay.statistics.items()},
        "metrics": replay.metrics,
    }
