"""Where a JAX profiler trace's time went: each device's programs, the busy share of the traced window, and the
operations that took the most device time (from the ``perfetto_trace.json.gz`` `jax.profiler.trace` writes with
``create_perfetto_trace=True``, e.g. ``serve.py --profile tpu --trace DIR``).

    python benchmarks/probes/trace_summary.py DIR [--top 30] [--output summary.json]
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
from pathlib import Path
from typing import Any


def load_events(folder: Path) -> list[dict[str, Any]]:
    """The events of the newest ``*trace.json.gz`` under ``folder`` (Perfetto's where both are)."""
    files = sorted(
        folder.rglob("*trace.json.gz"), key=lambda path: (path.stat().st_mtime, "perfetto" in path.name)
    )
    if not files:
        raise SystemExit(f"trace_summary: no *trace.json.gz under {folder}")
    with gzip.open(files[-1]) as stream:
        data = json.load(stream)
    return data["traceEvents"] if isinstance(data, dict) else data


def summarize(events: list[dict[str, Any]], top: int) -> dict[str, Any]:
    """Per device process: each thread's busy time, and the ``top`` names by total time on each thread."""
    processes = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    spans: dict[tuple[str, str], list[dict[str, Any]]] = collections.defaultdict(list)
    for event in events:
        if event.get("ph") == "X":
            key = (processes.get(event["pid"], "?"), threads.get((event["pid"], event["tid"]), "?"))
            spans[key].append(event)
    summary: dict[str, Any] = {}
    for (process, thread), found in sorted(spans.items()):
        start = min(e["ts"] for e in found)
        end = max(e["ts"] + e.get("dur", 0) for e in found)
        totals: collections.Counter[str] = collections.Counter()
        counts: collections.Counter[str] = collections.Counter()
        for event in found:
            totals[event["name"]] += event.get("dur", 0)
            counts[event["name"]] += 1
        summary[f"{process} / {thread}"] = dict(
            window_us=end - start,
            busy_us=sum(totals.values()),
            top=[dict(name=name, total_us=us, count=counts[name]) for name, us in totals.most_common(top)],
        )
    return summary


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path, help="the folder given to jax.profiler.trace")
    parser.add_argument("--top", type=int, default=30, help="names listed per thread")
    parser.add_argument("--output", type=Path, default=None, help="also write the summary as JSON")
    args = parser.parse_args(argv)
    summary = summarize(load_events(args.trace), args.top)
    for thread, figures in summary.items():
        print(f"\n{thread}: busy {figures['busy_us'] / 1e3:.1f} ms of {figures['window_us'] / 1e3:.1f} ms")
        for row in figures["top"]:
            print(f"  {row['total_us'] / 1e3:9.2f} ms  {row['count']:6d}x  {row['name'][:110]}")
    if args.output is not None:
        args.output.write_text(json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    main()
