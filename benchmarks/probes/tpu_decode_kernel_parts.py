"""What bounds the token decode kernel (`halyard.models.attention.paged_decode_pallas`) on a TPU: its time per
layer call at 128 decoding rows (`tpu_paged_attention.measure`), whole, with its page copies only (each token's
chunk left unattended), and with its arithmetic only (no page copied: the buffers keep their zeros).

    python3 benchmarks/probes/tpu_decode_kernel_parts.py        # on the TPU; one JSON line per part and context
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tpu"))


def main() -> None:
    import tpu_paged_attention as bench

    from halyard.models.attention import paged_decode_pallas as kernel_module
    from halyard.models.attention.ragged_paged_pallas import PallasPagedKernel

    args = argparse.Namespace(
        rows=128, layers=24, query_heads=14, kv_heads=2, head_size=64, dtype="bfloat16", repeats=5
    )
    whole = (kernel_module._attend_chunk, kernel_module._page_copies)
    parts = {
        "whole": whole,
        "copies_only": (lambda **_: None, whole[1]),
        "arithmetic_only": (whole[0], lambda *_, **__: []),
    }
    for context in (550, 2048):
        for name, (attend, copies) in parts.items():
            kernel_module._attend_chunk, kernel_module._page_copies = attend, copies
            row = bench.measure(PallasPagedKernel(by_token="always"), args, 256, context)
            print(json.dumps({"part": name, "context": context, "attend_us": row["attend_us_per_layer"],
                              "padded_roofline_us": row["padded_roofline_us"]}), flush=True)  # fmt: skip
    kernel_module._attend_chunk, kernel_module._page_copies = whole


if __name__ == "__main__":
    main()
