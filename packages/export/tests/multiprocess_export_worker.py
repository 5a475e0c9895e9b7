"""One process of a two-process CPU run (gloo collectives): import a checkpoint sharded over both
processes' devices, then `export_hf` it. Run by `test_multiprocess_export.py`, not collected by pytest.

Usage: ``python multiprocess_export_worker.py PROCESS_ID PORT HF_FOLDER OUT_FOLDER VOCAB LAYOUT``
with ``LAYOUT`` = ``fsdp`` or ``axis=mesh_axis,...`` (a `halyard.shard.Layout` rule table).
"""

from __future__ import annotations

import sys

import jax


def main(process_id: int, port: str, hf_folder: str, out_folder: str, vocab: int, layout_text: str) -> None:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        f"localhost:{port}", num_processes=2, process_id=process_id, local_device_ids=list(range(4))
    )
    from halyard.export import export_hf, import_hf
    from halyard.shard import Layout, MeshSpec

    if layout_text == "fsdp":
        layout = Layout.fsdp(min_shard=1)
    else:
        layout = Layout(dict(rule.split("=") for rule in layout_text.split(",")), min_shard=1)
    _, model = import_hf(hf_folder, layout=layout, mesh=MeshSpec(data=1, fsdp=8).build())
    assert jax.process_count() == 2 and not model.embed.weight.array.is_fully_addressable
    export_hf(model, out_folder, vocab_size=vocab, max_shard_bytes=16 * 1024)
    print(f"process {process_id} exported", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6])
