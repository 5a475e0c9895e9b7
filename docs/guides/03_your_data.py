# %% [markdown]
# # Your own data
#
# Training reads tokens from a **token cache**: your text files tokenized once into a folder of flat
# token arrays, built in parallel, resumable after a crash, and byte-identical however it was built. This
# guide writes a small corpus as jsonl and parquet files (with some bad records on purpose), builds caches
# with the local builder and with Ray, and reads batches: shuffled, split for validation and mixed.
#
# `halyard.data` needs no JAX: a PyTorch loop can use it as well (the run config, at the end, is
# halyard.train's).

# %%
import filecmp
import json
import os
import shutil
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from halyard.data import BadRecordError, LMDataset, MissingFieldError, MixtureDataset, TokenCache, build_cache
from halyard.train import ConfigError, TrainConfig, parse_config

SMOKE = os.environ.get("HALYARD_DOCS_SMOKE") == "1"
WORK = Path(os.environ.get("HALYARD_DOCS_WORK", "guide_runs")).resolve() / "your-data"
FIGURES = Path(os.environ.get("HALYARD_DOCS_FIGURES", Path(__file__).resolve().parent / "figures"))
FIGURES.mkdir(parents=True, exist_ok=True)
shutil.rmtree(WORK, ignore_errors=True)
(WORK / "web").mkdir(parents=True)
(WORK / "code").mkdir()

# %% [markdown]
# ## A corpus: jsonl and parquet shards
#
# Two sources: "web" text as jsonl files (one `{"text": ...}` object per line) and "code" as parquet
# files with a `text` column. Each file is a **shard**; a build processes shards in parallel. One web
# shard holds records a real crawl has: a line that is not JSON, an empty text and bytes that are not
# UTF-8.

# %%
rng = np.random.default_rng(0)
words = [
    "the",
    "a",
    "ship",
    "sails",
    "mast",
    "rope",
    "halyard",
    "wind",
    "sea",
    "harbour",
    "crew",
    "deck",
    "raises",
    "lowers",
    "flag",
    "at",
    "dawn",
]
documents = 60 if SMOKE else 600


def sentence() -> str:
    return " ".join(rng.choice(words, size=rng.integers(5, 14))).capitalize() + "."


for shard in range(3):
    with open(WORK / "web" / f"part-{shard:03d}.jsonl", "w") as file:
        for _ in range(documents // 3):
            file.write(json.dumps({"text": " ".join(sentence() for _ in range(rng.integers(1, 6)))}) + "\n")
with open(WORK / "web" / "part-001.jsonl", "ab") as file:  # the crawl's bad records
    file.write(b'{"text": "a line cut in the middl\n')
    file.write(b'{"text": ""}\n')
    file.write(b'{"text": "caf\xe9 in latin-1, not utf-8"}\n')

snippets = [f"def f{i}(x):\n    return x * {i} + {i % 7}\n" for i in range(documents)]
for shard in range(2):
    pq.write_table(pa.table({"text": snippets[shard::2]}), WORK / "code" / f"part-{shard:03d}.parquet")
print(sorted(path.name for path in WORK.rglob("part-*")))

# %% [markdown]
# ## A tokenizer
#
# Any Hugging Face `tokenizer.json` works (or a tokenizer folder, or a `transformers` fast tokenizer).
# Here we train a small byte-level BPE on the corpus, with an end-of-text token: documents in the cache
# are separated by it.

# %%
tokenizer = Tokenizer(models.BPE())
tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tokenizer.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(
    vocab_size=600,
    special_tokens=["<|endoftext|>"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte: any text can be encoded
    show_progress=False,
)
texts = [sentence() for _ in range(300)] + snippets
tokenizer.train_from_iterator(texts, trainer)
tokenizer.save(str(WORK / "tokenizer.json"))
print("vocabulary:", tokenizer.get_vocab_size())

# %% [markdown]
# ## Build a cache with the local builder
#
# `build_cache(sources, tokenizer, out_dir)` reads the shards, tokenizes documents in batches and writes
# chunks of tokens. Sources are paths, globs, braces (`part-{000..002}.jsonl`) or fsspec URLs (`s3://`,
# `gs://`, `https://`). `num_workers=N` tokenizes shards in N processes (the default: one per core; a
# script that uses it must guard its top level with `if __name__ == "__main__":`, as worker processes
# import it); `num_workers=0` builds in this process. Bad records are skipped and counted.

# %%
web = build_cache(
    str(WORK / "web" / "*.jsonl"),
    WORK / "tokenizer.json",
    str(WORK / "caches/web"),
    num_workers=0,
    progress=False,
)
print(web.num_documents, "documents,", web.num_tokens, "tokens, finished:", web.is_finished)
print("bad records:", web.totals["counters"])

code = build_cache(
    str(WORK / "code" / "*.parquet"),
    WORK / "tokenizer.json",
    str(WORK / "caches/code"),
    num_workers=0,
    progress=False,
)
print(code.num_documents, "code documents,", code.num_tokens, "tokens")
first = code.document(0)
print(first, "->", repr(tokenizer.decode(first.tolist())))

# %% [markdown]
# Building again into the same folder is free (the ledger says it is finished), and a build killed at any
# moment resumes from its last committed chunk when run again. The same build from the command line:
#
# ```bash
# halyard cache build --source 'data/web/*.jsonl' --tokenizer tokenizer.json --out caches/web
# halyard cache info caches/web
# ```
#
# ## Bad records, strictly
#
# With `strict=True` the first bad record stops the build with its file and line, which is what you want
# while preparing a new dataset. A record without the text field always stops it: that is a wrong
# `text_field`, not noise.

# %%
try:
    build_cache(
        str(WORK / "web" / "*.jsonl"),
        WORK / "tokenizer.json",
        str(WORK / "caches/strict"),
        num_workers=0,
        strict=True,
        progress=False,
    )
except BadRecordError as error:
    print("BadRecordError:", error)
(WORK / "other").mkdir()
(WORK / "other" / "notes.jsonl").write_text('{"body": "the text is under another key"}\n')
try:
    build_cache(
        str(WORK / "other" / "notes.jsonl"),
        WORK / "tokenizer.json",
        str(WORK / "caches/other"),
        num_workers=0,
        progress=False,
    )
except MissingFieldError as error:
    print("MissingFieldError:", error)

# %% [markdown]
# ## The same build with Ray
#
# `builder="ray"` runs one task per shard on a Ray cluster (`ray_address=`), or on a local Ray started for
# the build. The cache folder must be reachable by every node under the same path or URL (an object store
# on a real cluster). The files are the same bytes as the local build's.

# %%
ray_cache = build_cache(
    str(WORK / "web" / "*.jsonl"),
    WORK / "tokenizer.json",
    str(WORK / "caches/web-ray"),
    builder="ray",
    progress=False,
)
comparison = filecmp.dircmp(WORK / "caches/web", WORK / "caches/web-ray")
print(
    "ray build:",
    ray_cache.num_tokens,
    "tokens; files that differ from the local build:",
    comparison.diff_files,
)
assert ray_cache.fingerprint == web.fingerprint and not comparison.diff_files
for shard in sorted((WORK / "caches/web/shards").iterdir()):
    for file in sorted(shard.iterdir()):
        assert filecmp.cmp(file, WORK / "caches/web-ray/shards" / shard.name / file.name, shallow=False)

# %% [markdown]
# ## Batches: windows, shuffles and a validation split
#
# `LMDataset` cuts the cache's token stream into windows of `seq_len + 1` tokens (inputs and shifted
# targets) and serves batches; `segment_ids` number the documents inside each row, so attention and the
# loss stay inside a document. A batch is a pure function of (cache, settings, seed, step): resuming at
# step 1000 needs no state but the step.
#
# - `shuffle="feistel"`: a keyed permutation of all windows (a new one each epoch);
# - `shuffle="era"`: a permutation inside each era of `era_windows` windows, usable while the cache is
#   still being built;
# - `shuffle="none"`: the stream order.

# %%
cache = TokenCache.open(str(WORK / "caches/web"))
seq_len = 16
dataset = LMDataset(cache, seq_len=seq_len, seed=0, shuffle="feistel")
batch = dataset.batch(step=0, batch_size=4)
print({key: value.shape for key, value in batch.items()})
print("row 0:", repr(tokenizer.decode(batch["tokens"][0].tolist())))
print("segments of row 0:", batch["segment_ids"][0])
assert np.array_equal(
    batch["tokens"], LMDataset(cache, seq_len=seq_len, seed=0).batch(step=0, batch_size=4)["tokens"]
)

train = LMDataset(cache, seq_len=seq_len, split="train", validation_fraction=0.1)
validation = LMDataset(cache, seq_len=seq_len, split="validation", validation_fraction=0.1)
print("windows:", len(dataset), "= train", len(train), "+ validation", len(validation))
assert len(train) + len(validation) == len(dataset)

# %% [markdown]
# Where each shuffle takes its examples from, over the first few batches:

# %%
count = min(len(dataset), 64)
figure, axes = plt.subplots(1, 3, figsize=(9.5, 2.8), sharey=True)
for ax, shuffle in zip(axes, ["none", "era", "feistel"]):
    shuffled = LMDataset(cache, seq_len=seq_len, seed=0, shuffle=shuffle, era_windows=16)
    ax.plot(range(count), shuffled.windows(np.arange(count)), ".")
    ax.set_title(f'shuffle="{shuffle}"')
    ax.set_xlabel("example index")
axes[0].set_ylabel("window number in the stream")
figure.tight_layout()
figure.savefig(FIGURES / "03_shuffles.png", dpi=100)

# %% [markdown]
# ![Stream order, permutations inside eras of 16 windows, and a whole-cache permutation](figures/03_shuffles.png)
#
# ## Mixtures
#
# `MixtureDataset` draws each batch from several datasets in fixed proportions: every block of
# `block_size` rows holds exactly each component's rounded share, at keyed positions, and each component
# reads its own examples in order (nothing skipped or repeated). The weights may change at given steps,
# for example to anneal on code at the end. Each row says where it came from (`source`).

# %%
code_dataset = LMDataset(TokenCache.open(str(WORK / "caches/code")), seq_len=seq_len, seed=0)
schedule = [(0, {"web": 0.8, "code": 0.2}), (8, {"web": 0.4, "code": 0.6})]
mixture = MixtureDataset({"web": dataset, "code": code_dataset}, schedule, block_size=8)
shares = []
for step in range(16):
    source = mixture.batch(step=step, batch_size=8)["source"]
    shares.append(float(np.mean(source == mixture.names.index("code"))))
print("share of code rows per step:", shares)
assert shares == [round(0.2 * 8) / 8] * 8 + [round(0.6 * 8) / 8] * 8  # whole rows per block of 8

figure, ax = plt.subplots(figsize=(6, 2.8))
ax.step(range(16), shares, where="mid", label="code rows in the batch")
ax.axvline(7.5, color="gray", linestyle="--", label="weights change at step 8")
ax.set_xlabel("step")
ax.set_ylabel("share of the batch")
ax.set_ylim(0, 1)
ax.legend()
figure.tight_layout()
figure.savefig(FIGURES / "03_mixture.png", dpi=100)

# %% [markdown]
# ![The share of code rows in each batch follows the schedule exactly](figures/03_mixture.png)
#
# ## Training on it
#
# The run config points at the same files; the trainer builds (or reuses) the cache in `data.cache_dir`,
# in the background while it trains:
#
# ```yaml
# data:
#   sources: ["data/web/*.jsonl"]
#   tokenizer: data/tokenizer.json
#   seq_len: 1024
#   shuffle: era          # starts training once the first era is tokenized; feistel waits for the whole cache
#   era_windows: 4096
#   builder: local        # every host tokenizes its share of the shards; ray: a Ray cluster does
#   validation_fraction: 0.01
# ```
#
# Step 1 runs as soon as its batches are tokenized; the build goes on beside training, its tokenizer
# processes at a lower CPU priority (niceness +10) so compilation and steps come first. With `builder:
# local` on N processes, process `h` tokenizes shards `h, h + N, ...` into the one cache (which must be
# on a disk every process sees); with `builder: ray` (and `ray_address`, or a local Ray) process 0 sends
# every shard to the cluster. Both write the bytes of a one-process build. A step that catches up with the
# build waits, and says what it waits for and how fast the build goes; the goodput summary counts that
# time as "waiting for data", and every logged record carries the build's progress (`data/build_tokens`,
# `data/build_shards_finished`, `data/build_tokens_per_second`, `data/build_finished`). A batch never
# depends on how far the build had got, so a run started on a partial cache, killed, and resumed on the
# finished one has the bits of a run started on the finished cache. A run that ends before the build
# stops it; the next run (or `halyard cache build`) resumes it.
#
# ### A mixture in the run config
#
# `data.mixture` names the sources, each a `data:` section of its own (the keys it leaves out come from
# `data:`; the tokenizer and `seq_len` are shared), with `weights` and a `schedule` of weights by step.
# Each source gets its own cache, built beside training; the metrics add `train/<source>/loss` and each
# source's validation, `eval/<source>/loss`. A resume with other weights is refused unless
# `data.allow_mixture_change: true`. Bad weights are refused at once, naming the key:

# %%
mixed = [
    f"--data.tokenizer={WORK / 'tokenizer.json'}",
    "--data.mixture.sources={web: {sources: [web/*.jsonl]}, code: {sources: [code/*.parquet]}}",
    "--data.mixture.weights={web: 0.8, code: 0.2}",
    "--data.mixture.schedule={8: {web: 0.4, code: 0.6}}",
]
run = parse_config(TrainConfig, mixed)
print({name: source["sources"] for name, source in run.data.mixture.sources.items()})
try:
    parse_config(TrainConfig, [*mixed, "--data.mixture.schedule={8: {web: 0.4, cod: 0.6}}"])
except ConfigError as error:
    print("ConfigError:", error)

# %% [markdown]
# The cache format and every guarantee are described on the [halyard.data page](../packages/data-cache.md).
# Next: [scale one run across many devices](04_scaling.md).
