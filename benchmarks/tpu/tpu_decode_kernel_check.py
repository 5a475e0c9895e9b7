"""The token-by-token decode kernel (`halyard.models.attention.paged_decode_pallas`) compiled on a TPU: its
outputs against the dense reference on the kernel tests' ragged step (every dtype, window and soft-cap case of
test_ragged_paged_pallas.py's chip check), and, on decode steps of Qwen2.5-0.5B's attention shape, how many of
its output values differ from JAX's ragged kernel's bit for bit (deterministic mode's row checks admit a
program only if they do not).

    python3 benchmarks/tpu/tpu_decode_kernel_check.py      # on the TPU; prints one JSON line
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "packages/models/tests"), str(ROOT / "tests/support")]


def main() -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from ragged_case import STEP_LAYER, dense_reference, ragged_step
    from test_ragged_paged_pallas import run_kernel, tolerance

    from halyard.models.attention.ragged_paged_pallas import PallasPagedKernel

    results: dict = {"backend": jax.default_backend()}
    cases = [
        ("float32", 9, 3, 6, 2.0, 8, 16), ("bfloat16", 9, 3, 6, 2.0, 8, None),
        ("bfloat16", 4, 2, None, None, 16, None), ("bfloat16", 14, 2, None, None, 64, 64),
        ("float32", 4, 2, 6, None, 64, None), ("bfloat16", 8, 1, None, 3.0, 16, None),
    ]  # fmt: skip
    for name, query_heads, kv_heads, window, cap, page_size, chunk in cases:
        dtype = jnp.dtype(name)
        step = ragged_step(dtype, query_heads, kv_heads, page_size)
        kernel = PallasPagedKernel(by_token="always", decode_chunk_keys=chunk)
        output = run_kernel(kernel, step, dtype, sliding_window=window, logit_softcap=cap)
        reference = dense_reference(step, STEP_LAYER, sliding_window=window, logit_softcap=cap)
        case = f"{name} {query_heads}/{kv_heads} window={window} cap={cap} page={page_size} chunk={chunk}"
        results[case] = [float(np.max(np.abs(output - reference))), tolerance(reference, "bfloat16")]
    results["bitwise"] = bitwise_against_jax(jax, jnp, np, PallasPagedKernel)
    return results


def bitwise_against_jax(jax, jnp, np, kernel_class) -> dict:
    """Decode steps (one token per sequence) of 14 query heads on 2 kv heads of 64 in bfloat16, pages of 256:
    the share of output values in which the token kernel and JAX's kernel differ, per context length."""
    rng = np.random.default_rng(0)
    rows, page_size, layers = 64, 256, 2
    figures = {}
    for context, width in ((300, 2), (550, 4), (1400, 6)):
        pages = rows * width
        tokens = {}
        table = rng.permutation(pages).reshape(rows, width).astype(np.int32)
        kv_lens = rng.integers(context // 2, context + 1, rows).astype(np.int32)
        query = jnp.asarray(rng.normal(size=(rows, 14, 64)), jnp.bfloat16)
        keys = jnp.asarray(rng.normal(size=(pages * page_size, 2, 64)), jnp.bfloat16)
        values = jnp.asarray(rng.normal(size=(pages * page_size, 2, 64)), jnp.bfloat16)
        for by_token in ("always", "never"):
            kernel = kernel_class(by_token=by_token)
            pool = kernel.init_pool(layers, pages, page_size, 2, 64, jnp.bfloat16)

            def program(pool, query, keys, values, kernel=kernel, pages=pages, table=table, kv_lens=kv_lens):
                slots = jnp.arange(pages * page_size, dtype=jnp.int32)
                pool = kernel.write(pool, jnp.int32(1), keys, values, slots)
                layout = (jnp.asarray(table), jnp.arange(rows + 1, dtype=jnp.int32), jnp.asarray(kv_lens))
                step = kernel.prepare(pool, *layout, jnp.asarray(rows, jnp.int32), tokens=rows)
                return kernel.attend(
                    query, pool, jnp.int32(1), step, scale=0.125, sliding_window=None, logit_softcap=None
                )  # fmt: skip

            tokens[by_token] = np.asarray(jax.jit(program)(pool, query, keys, values).astype(jnp.float32))
        differ = tokens["always"] != tokens["never"]
        figures[f"context {context} table {width}"] = {
            "values_differing": float(differ.mean()),
            "rows_differing": int(differ.reshape(rows, -1).any(axis=1).sum()),
            "largest_difference": float(np.max(np.abs(tokens["always"] - tokens["never"]))),
        }
    return figures


if __name__ == "__main__":
    print(json.dumps(main()))
