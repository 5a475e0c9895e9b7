"""Smoke use of halyard-data-cache installed alone (no JAX): build a token cache and read a batch.

Run as ``python data_cache.py FOLDER``; the corpus and tokenizer come from the package's test helpers
(plain numpy and tokenizers code, found through the repository, not installed).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "packages" / "data-cache" / "tests"))

from data_helpers import make_documents, train_tokenizer, write_jsonl_shards

from halyard.data import LMDataset, build_cache


def main(folder: Path) -> None:
    tokenizer = train_tokenizer()
    tokenizer.save(str(folder / "tokenizer.json"))
    shards = write_jsonl_shards(folder / "corpus", make_documents(40), num_shards=2)
    cache = build_cache(
        str(folder / "corpus"), str(folder / "tokenizer.json"), str(folder / "cache"), progress=False
    )
    assert cache.num_documents == 40, cache.num_documents
    first = tokenizer.decode(cache.document(0).tolist())
    assert first.startswith(shards[0][0]), (first, shards[0][0])  # shard 0's first line, then the EOS
    batch = LMDataset(cache, seq_len=16, seed=0, shuffle="feistel").batch(step=0, batch_size=4)
    assert batch["tokens"].shape == (4, 17), batch["tokens"].shape
    assert "jax" not in sys.modules, "halyard.data imported jax"
    print("data-cache ok", cache.num_documents, "documents,", cache.num_tokens, "tokens")


if __name__ == "__main__":  # build workers are started with 'spawn' and import this script again
    main(Path(sys.argv[1]))
