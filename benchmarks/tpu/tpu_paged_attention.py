"""The paged attention of a decode step on one TPU chip against the HBM roofline: 128 rows decoding, one
token each, over ``--context`` keys each, Qwen2.5-0.5B's attention shape (14 query heads on 2 kv heads of
64, bfloat16, 24 layers of pages in the pool).

Each kernel (`PallasPagedKernel`, JAX's Pallas ragged paged attention; and the engine's CPU kernel, when the
ragged interface's ``BlockedPagedKernel`` is there) runs ``write`` (the step's 128 keys and values) and
``attend`` for every layer inside one program (a ``fori_loop`` over a traced layer index, as the engine's
layer scan does: a kernel that copied a layer's pages out of the pool would show it), timed over
``--repeats`` calls after a compiling one. The figure is the time per layer call against the roofline: the
bytes one layer's attention must move (every row's keys and values, ``kv_len x 2 x kv_heads x head_size``
elements, plus the queries read and the outputs written) at 819 GB/s, the v5e's HBM bandwidth;
``padded_roofline_us`` counts what the kernel's pool holds for them (whole pages, its rows as laid out:
`halyard.models.attention.pallas_paged_layout`).

    python3 benchmarks/tpu/tpu_paged_attention.py                       # on the TPU: JSON to $OUT, or results/
    python3 benchmarks/tpu/tpu_paged_attention.py --page-size 16 64 --context 512 2048
    python3 benchmarks/tpu/tpu_paged_attention.py --page-size 256 --context 2048 --no-blocked \
        --kv-pages-per-block 1 2 4 8 --queries-per-block 8 32 128   # a block-size sweep: a row each
    python3 benchmarks/tpu/tpu_paged_attention.py --smoke               # tiny, on CPU (interpreted): the code path
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

HBM_BYTES_PER_SECOND = 819e9
"""TPU v5e's HBM bandwidth (the vendor's figure, ../shared/TPU.md)."""
RESULTS = Path(__file__).resolve().parents[1] / "results"
SETTINGS = (
    "rows", "layers", "query_heads", "kv_heads", "head_size", "dtype", "kv_pages_per_block", "queries_per_block",
    "vmem_limit_mib", "by_token",
)  # fmt: skip
"""The arguments the JSON records."""


def measure(kernel: Any, args: argparse.Namespace, page_size: int, context: int) -> dict[str, Any]:
    """One kernel at one page size and context: the time per layer call of write + attend and of attend."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    rows, layers = args.rows, args.layers
    pages_per_row = -(-context // page_size)
    pages = rows * pages_per_row
    dtype = jnp.dtype(args.dtype)
    rng = np.random.default_rng(0)
    pool = kernel.init_pool(layers, pages, page_size, args.kv_heads, args.head_size, dtype)
    leaves = jax.tree.leaves(pool)  # their sizes, read after the pool is donated
    # rows own pages in a shuffled order, as a long-running pool's free list leaves them
    table = rng.permutation(pages).reshape(rows, pages_per_row).astype(np.int32)
    positions = np.full((rows,), context - 1)
    slots = table[np.arange(rows), positions // page_size] * page_size + positions % page_size
    batch = {
        "page_table": jnp.asarray(table),
        "cu_q_lens": jnp.arange(rows + 1, dtype=jnp.int32),
        "kv_lens": jnp.full((rows,), context, jnp.int32),
        "num_seqs": jnp.asarray(rows, jnp.int32),
    }
    query = jnp.asarray(rng.normal(size=(rows, args.query_heads, args.head_size)), dtype)
    keys = jnp.asarray(rng.normal(size=(rows, args.kv_heads, args.head_size)), dtype)
    settings = dict(scale=args.head_size**-0.5, sliding_window=None, logit_softcap=None)

    def step(pool: Any, write: bool) -> tuple[Any, jax.Array]:
        # once a step, as the engine's layer scan does (`RaggedPagedKernel.prepare`)
        prepared = kernel.prepare(pool, **batch, tokens=rows)

        def layer_call(layer: jax.Array, carry: tuple[Any, jax.Array]) -> tuple[Any, jax.Array]:
            pool, total = carry
            if write:
                pool = kernel.write(pool, layer, keys, keys, jnp.asarray(slots))
            output = kernel.attend(query, pool, layer, prepared, **settings)
            return pool, total + output[0, 0, 0].astype(jnp.float32)

        return jax.lax.fori_loop(0, layers, layer_call, (pool, jnp.float32(0)))

    figures: dict[str, Any] = {}
    for name, write in (("write_attend", True), ("attend", False)):
        program = jax.jit(step, static_argnums=1, donate_argnums=0)
        started = time.perf_counter()
        pool, total = program(pool, write)
        jax.block_until_ready(total)
        figures[f"{name}_first_call_s"] = round(time.perf_counter() - started, 3)
        times = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            pool, total = program(pool, write)
            jax.block_until_ready(total)
            times.append(time.perf_counter() - started)
        figures[f"{name}_us_per_layer"] = round(min(times) / layers * 1e6, 2)
    item = dtype.itemsize
    io_bytes = 2 * rows * args.query_heads * args.head_size * item  # queries read, outputs written
    kv_bytes = rows * context * 2 * args.kv_heads * args.head_size * item
    pool_row_bytes = sum(leaf.size * leaf.dtype.itemsize for leaf in leaves) // (layers * pages * page_size)
    padded_kv_bytes = rows * pages_per_row * page_size * pool_row_bytes
    roofline_us = (kv_bytes + io_bytes) / HBM_BYTES_PER_SECOND * 1e6
    figures.update(
        roofline_us=round(roofline_us, 2),
        padded_roofline_us=round((padded_kv_bytes + io_bytes) / HBM_BYTES_PER_SECOND * 1e6, 2),
        attend_over_roofline=round(figures["attend_us_per_layer"] / roofline_us, 2),
        kv_megabytes_per_layer=round(kv_bytes / 1e6, 2),
        pool_gigabytes=round(sum(leaf.size * leaf.dtype.itemsize for leaf in leaves) / 1e9, 3),
    )
    return figures


def kernels(args: argparse.Namespace) -> dict[str, Any]:
    """The kernels to measure: the Pallas one, and the CPU one where the ragged interface has it."""
    from halyard.models.attention import paged
    from halyard.models.attention.ragged_paged_pallas import PallasPagedKernel

    vmem = None if args.vmem_limit_mib is None else args.vmem_limit_mib * 2**20
    chosen: dict[str, Any] = {}
    for by_token in args.by_token:
        for kv_pages in args.kv_pages_per_block or [None]:
            for queries in args.queries_per_block or [None]:
                name = "pallas" if kv_pages is None and queries is None else f"pallas kv{kv_pages} q{queries}"
                name += "" if by_token == "decode" else f" by_token={by_token}"
                chosen[name] = PallasPagedKernel(kv_pages, queries, vmem, by_token=by_token)
    if hasattr(paged, "BlockedPagedKernel") and not (args.smoke or args.no_blocked):
        chosen["blocked"] = paged.BlockedPagedKernel()
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=128, help="decoding sequences, one token each")
    parser.add_argument("--context", type=int, nargs="+", default=[512, 2048], help="keys per row")
    parser.add_argument("--page-size", type=int, nargs="+", default=[16, 64], help="tokens per page")
    parser.add_argument("--layers", type=int, default=24, help="layers of pages in the pool (and calls)")
    parser.add_argument("--query-heads", type=int, default=14)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-size", type=int, default=64)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument(
        "--kv-pages-per-block",
        type=int,
        nargs="+",
        help="the Pallas kernel's (several: each); default: JAX's table",
    )
    parser.add_argument(
        "--queries-per-block",
        type=int,
        nargs="+",
        help="the Pallas kernel's (several: each); default: JAX's table",
    )
    parser.add_argument(
        "--by-token",
        nargs="+",
        default=["decode"],
        help="PallasPagedKernel.by_token (several: each): decode runs our token kernel here, never JAX's",
    )
    parser.add_argument("--no-blocked", action="store_true", help="the Pallas kernel only")
    parser.add_argument("--vmem-limit-mib", type=int, help="the Pallas kernel's VMEM limit; default: XLA's")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls after the compiling one")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on CPU, the kernel interpreted")
    parser.add_argument("--output", type=Path, help="the JSON file; default $OUT/ or benchmarks/results/")
    args = parser.parse_args(argv)
    if args.smoke:
        args.rows, args.context, args.page_size, args.layers, args.repeats = 4, [24], [8], 2, 1
    import jax

    rows: list[dict[str, Any]] = []
    for name, kernel in kernels(args).items():
        for page_size in args.page_size:
            for context in args.context:
                row: dict[str, Any] = {"kernel": name, "page_size": page_size, "context": context}
                try:
                    row.update(measure(kernel, args, page_size, context), status="ok")
                except Exception as error:  # a shape the kernel refuses or that does not fit: a row says so
                    row["status"] = f"failed: {type(error).__name__}: {str(error).splitlines()[0][:300]}"
                rows.append(row)
                print(json.dumps(row), flush=True)
    result = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "jax": jax.__version__,
        "device": str(jax.devices()[0].device_kind),
        "python": platform.python_version(),
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
        "settings": {key: getattr(args, key) for key in SETTINGS},
        "rows": rows,
    }
    output = args.output or Path(os.environ.get("OUT") or RESULTS) / "tpu_paged_attention.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {output}")
    return 0 if all(row["status"] == "ok" for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
