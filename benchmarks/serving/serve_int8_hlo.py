"""Whether an int8 weight is converted inside its product or copied out whole first (issue 69).

Compiles one decode-shaped projection (Qwen2.5-0.5B's MLP up projection, 896 -> 4864, at 128 rows) with a
bfloat16 weight and with an int8 weight (`halyard.serve.int8_weights.Int8Linear`), and the output head
(896 -> 151,936: `Int8HeadModel.logits` against the bfloat16 product `CausalLM.logits` computes), and counts
the instructions of each compiled program's entry computation, outside any fusion that holds the product,
whose result is a floating array of the weight's size: a full-size copy of the weight written to memory. On the
TPU the int8 program should have none (the convert is fused into the product's operand: the weight is read
from HBM as int8); on the CPU both programs have one (XLA's CPU products take float32 operands, so a
bfloat16 weight is copied to float32 too).

    python3 benchmarks/serving/serve_int8_hlo.py            # the device JAX finds (the TPU on the chip)
    python3 benchmarks/serving/serve_int8_hlo.py --cpu-smoke  # small shapes on the CPU
"""

from __future__ import annotations

import argparse
import json
import math
import re

import equinox as eqx
import jax
import jax.numpy as jnp

import halyard.named as hn
from halyard.models import init_model, model_config
from halyard.named import Axis, named
from halyard.named.nn import Linear
from halyard.serve.int8_weights import Int8HeadModel, Int8Linear

_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%\S+\s*=\s*(\w+)\[([\d,]*)\]\S*\s+(\w+)\(")
_FLOATS = {"f32", "bf16", "f16"}


def weight_copies(rows: int, inputs: int, outputs: int, dtype: str = "bfloat16") -> dict[str, int]:
    """``{"bfloat16": n, "int8": m}``: full-size float copies of the weight outside the product in the
    compiled program of a ``rows x inputs`` by ``inputs x outputs`` projection, per weight kind."""
    In, Out = Axis("embed", inputs), Axis("mlp", outputs)
    plain = Linear.init(In, Out, key=jax.random.key(0), use_bias=False, dtype=jnp.dtype(dtype))
    x = named(jnp.ones((rows, inputs), jnp.dtype(dtype)), ("batch", "embed"))
    apply = jax.jit(lambda layer, x: layer(x).array)
    return {
        kind: _full_size_floats(apply.lower(layer, x).compile().as_text(), inputs * outputs)
        for kind, layer in (("bfloat16", plain), ("int8", Int8Linear.quantize(plain)))
    }


def head_copies(rows: int, embed: int, vocab: int, dtype: str = "bfloat16") -> dict[str, int]:
    """`weight_copies` of the output head: ``rows`` hidden states by a ``vocab x embed`` matrix, bfloat16 (as
    `CausalLM.logits` multiplies) and int8 (`Int8HeadModel.logits`)."""
    inner = init_model(
        model_config(
            "llama",
            vocab_size=8,
            hidden_size=embed,
            intermediate_size=8,
            num_layers=1,
            num_heads=1,
            num_kv_heads=1,
        ),
        jax.random.key(0),
    )  # fmt: skip  (only its softcap is read: none)
    matrix = named(jax.random.normal(jax.random.key(1), (vocab, embed), jnp.dtype(dtype)), ("vocab", "embed"))
    hidden = named(jnp.ones((rows, embed), jnp.dtype(dtype)), ("batch", "embed"))
    int8 = Int8HeadModel.wrap(eqx.tree_at(lambda model: model.embed.weight, inner, matrix))
    plain = jax.jit(lambda matrix, hidden: hn.dot(hidden, matrix.astype(hidden.dtype), axis="embed").array)
    quantized = jax.jit(lambda model, hidden: model.logits(hidden).array)
    return {
        "bfloat16": _full_size_floats(plain.lower(matrix, hidden).compile().as_text(), vocab * embed),
        "int8": _full_size_floats(quantized.lower(int8, hidden).compile().as_text(), vocab * embed),
    }


def _full_size_floats(hlo: str, elements: int) -> int:
    """Entry-computation instructions (no parameters) with a floating result of ``elements`` elements."""
    entry = hlo[hlo.index("\nENTRY") :]
    count = 0
    for line in entry.splitlines()[1:]:
        match = _INSTRUCTION.match(line)
        if match is None:
            continue
        dtype, dims, op = match.groups()
        size = math.prod(int(d) for d in dims.split(",") if d)
        count += dtype in _FLOATS and size == elements and op not in ("parameter",)
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="small shapes (a test runs this)")
    args = parser.parse_args()
    shape, head = ((8, 64, 128), (8, 64, 512)) if args.cpu_smoke else ((128, 896, 4864), (128, 896, 151936))
    result = {
        "backend": jax.default_backend(),
        "projection": {"rows_inputs_outputs": shape, **weight_copies(*shape)},
        "head": {"rows_embed_vocab": head, **head_copies(*head)},
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
