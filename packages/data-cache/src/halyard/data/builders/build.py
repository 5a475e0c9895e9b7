"""``build_cache``: sources + tokenizer -> a token cache, resumable, in the foreground or the background."""

from __future__ import annotations

import dataclasses
import shutil
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import fsspec

from halyard.data.builders.build_lock import build_lock
from halyard.data.builders.local import default_num_workers, refuse_while_importing_main, run_local
from halyard.data.builders.progress import BuildProgress
from halyard.data.builders.ray_builder import run_ray
from halyard.data.builders.shard_worker import ShardJob, ensure_folder, shard_is_finished
from halyard.data.cache.ledger import (
    ShardProgress,
    build_identity,
    changed_sources,
    identity_differences,
    load_cache_ledger,
    matching_identity,
    relocate_cache_ledger,
    save_cache_ledger,
)
from halyard.data.cache.reader import TokenCache
from halyard.data.errors import DataInputError
from halyard.data.examples.formats import ExampleFormat
from halyard.data.processing.processor import Processor
from halyard.data.processing.tokenizer import TokenizerSpec, load_tokenizer
from halyard.data.sources.shards import SourceSpec, resolve_shards

DEFAULT_CHUNK_TOKENS = 1 << 19
DEFAULT_FIRST_CHUNK_TOKENS = 1 << 14


class BuildStopped(Exception):
    """Raised inside a background build's thread when ``BuildHandle.stop`` was called."""


class CacheMismatchError(DataInputError, ValueError):
    """The folder holds a cache built with other settings (tokenizer, BOS/EOS policy, sources, chunk size).

    Attributes:
        folder: the cache folder.
        differences: what differs, one line each: the message without its advice (which names
            ``build_cache``'s arguments), for a caller that gives advice in its own terms.
    """

    def __init__(self, message: str, folder: str = "", differences: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.folder = folder
        self.differences = list(differences)

    def __reduce__(self) -> tuple[Any, ...]:  # pickled with its attributes (e.g. from a worker process)
        return type(self), (str(self), self.folder, self.differences)


@dataclass
class BuildHandle:
    """A build running in a background thread of this process.

    ``cache`` is readable at once: reads wait for tokens that are not committed yet.
    """

    cache: TokenCache
    thread: threading.Thread
    errors: list[BaseException] = field(default_factory=list)
    shards: list[int] = field(default_factory=list)
    """The shards this process builds (its share; the others' are built by other hosts)."""
    stop_requested: threading.Event = field(default_factory=threading.Event)

    def stop(self, timeout: float | None = None) -> None:
        """Stop building (worker processes are terminated) and wait up to ``timeout`` s for the thread.

        What was committed stays; the next build of the same cache resumes from the ledgers.
        """
        self.stop_requested.set()
        self.thread.join(timeout)

    def done(self) -> bool:
        """True when the build stopped (finished or failed)."""
        return not self.thread.is_alive()

    def wait(self, timeout: float | None = None) -> TokenCache:
        """Wait for the build to end and return the refreshed cache.

        Raises:
            TimeoutError: still running after ``timeout`` seconds.
            the build's own exception, if it failed.
        """
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise TimeoutError(f"the build of {self.cache.root} is still running after {timeout} s")
        if self.errors:
            raise self.errors[0]
        self.cache.refresh()
        return self.cache


def build_cache(
    sources: SourceSpec | str | list[SourceSpec | str],
    tokenizer: Any,
    out_dir: str,
    *,
    text_field: str = "text",
    format: str = "auto",
    text_mode: str = "document",
    example_format: ExampleFormat | str = "text",
    bos: bool | str = "auto",
    eos: bool | str = "auto",
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    first_chunk_tokens: int = DEFAULT_FIRST_CHUNK_TOKENS,
    split_chars: int = 100_000,
    strict: bool = False,
    num_workers: int | None = None,
    builder: str = "local",
    ray_address: str | None = None,
    rebuild: bool = False,
    progress: bool = True,
    background: bool = False,
    host_index: int = 0,
    host_count: int = 1,
    relative_to: str | None = None,
    niceness: int = 0,
) -> TokenCache | BuildHandle:
    """Tokenize ``sources`` into a token cache at ``out_dir``; resume it if a build was interrupted.

    Args:
        sources: patterns (paths/URLs with braces and globs, folders), ``SourceSpec`` objects, or a list.
        tokenizer: a tokenizer.json path/URL, a tokenizer folder, or a tokenizer object.
        out_dir: the cache folder (local path or fsspec URL reachable by every worker).
        text_field: JSON key / column of the text, for patterns given as strings.
        format: ``"auto"`` (by suffix) or a format name, for patterns given as strings.
        text_mode: ``"document"`` or ``"line"`` for text files given as strings.
        example_format: what the records of patterns given as strings hold: ``"text"`` (documents),
            ``"chat"`` or ``"prompt_completion"`` (supervised fine-tuning examples; the cache then stores
            a per-token loss mask), ``"preference"`` (a prompt with a chosen and a rejected reply: two
            masked documents per record, read by ``PreferenceDataset``), or an ``ExampleFormat`` with
            field names and the chat template.
        bos: BOS policy: ``"auto"`` (what the tokenizer adds by itself), ``True``, ``False``, or a token.
        eos: EOS token: ``"auto"`` (detected) or a token; an EOS always ends each document.
        chunk_tokens: a chunk closes at the first document end at or after this many tokens.
        first_chunk_tokens: the first chunk of each shard targets this many tokens, each next one twice as
            many up to ``chunk_tokens`` (so the first batch is readable within seconds).
        split_chars: documents longer than this are tokenized in pieces (bounded memory).
        strict: fail with file:line on a malformed record or invalid UTF-8 instead of skipping/counting.
        num_workers: processes (local) or CPUs (Ray); default one per CPU; 0 builds in this process.
        builder: ``"local"`` (process pool, no Ray) or ``"ray"``.
        ray_address: the Ray cluster for ``builder="ray"`` (None: a local Ray).
        rebuild: delete a cache built with other settings instead of refusing it.
        progress: show a progress bar.
        background: return a ``BuildHandle`` at once and build in a thread (training can start reading).
        host_index: with ``host_count`` > 1, this host builds shards ``host_index``, ``host_index +
            host_count``, ... of the one shared cache; the host that finishes the last shard writes the
            finished ledger. Every host must call with the same arguments and its own index.
        host_count: the number of hosts sharing the build.
        relative_to: a local folder (a run directory): shards under it are recorded by their path inside
            it, so the folder with its corpus and cache can be moved or copied and still be reused.
        niceness: the local builder's worker processes run this much nicer (``os.nice``), so a build
            beside training takes only the CPU time training leaves.

    Returns:
        The ``TokenCache`` (finished unless other hosts still build their shares), or a ``BuildHandle``
        when ``background``.

    Raises:
        CacheMismatchError: ``out_dir`` holds a cache with other settings (the differences are listed).
        FileNotFoundError, ValueError, BadRecordError, MissingFieldError: bad sources or records (an
            invalid example is a ``BadRecordError`` naming file:line under ``strict``, else skipped and
            counted as ``bad_example``).
    """
    refuse_while_importing_main()
    if builder not in ("local", "ray"):
        raise ValueError(f"builder {builder!r} is not known; use 'local' or 'ray'")
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be positive, got {chunk_tokens}")
    if host_count < 1 or not 0 <= host_index < host_count:
        raise ValueError(f"host_index={host_index} must be in [0, host_count={host_count})")
    tokenizer_spec = load_tokenizer(tokenizer)
    if isinstance(example_format, str):
        example_format = ExampleFormat(kind=example_format)
    if isinstance(sources, str | SourceSpec):
        sources = [sources]
    specs = [
        SourceSpec(
            (source,), format=format, text_field=text_field, text_mode=text_mode, example=example_format
        )
        if isinstance(source, str)
        else source
        for source in sources
    ]
    specs = [_with_tokenizer_template(spec, tokenizer_spec) for spec in specs]
    processor = Processor.create(
        tokenizer_spec,
        bos=bos,
        eos=eos,
        split_chars=split_chars,
        loss_mask=any(spec.example is not None and spec.example.has_targets for spec in specs),
    )
    shards = resolve_shards(specs)
    described = [shard.describe(relative_to) for shard in shards]
    first_chunk_tokens = max(1, min(first_chunk_tokens, chunk_tokens))
    identity = build_identity(processor.metadata(), chunk_tokens, first_chunk_tokens, described)
    root = out_dir.rstrip("/")
    stored = load_cache_ledger(root)
    kept = None if stored is None else matching_identity(stored["identity"], identity)
    if stored is not None and kept is None:
        differences = changed_sources(stored["identity"], identity) or identity_differences(
            stored["identity"], identity
        )
        if not rebuild:
            raise CacheMismatchError(
                f"{root} holds a cache built with other settings:\n  "
                + "\n  ".join(differences)
                + "\nUse another output folder, or pass rebuild=True (--rebuild) to delete it and build again.",
                root,
                differences,
            )
        _delete_cache(root)
        stored = None
    elif stored is not None and kept is not None and kept != stored["identity"]:
        moved = sum(old != new for old, new in zip(stored["identity"]["shards"], kept["shards"]))
        print(
            f"halyard.data: {moved} source file(s) of {root} moved (same size and leading bytes); reusing it",
            file=sys.stderr,
        )
        relocate_cache_ledger(root, kept)
    identity = kept or identity
    ensure_folder(root)
    if stored is None:
        save_cache_ledger(root, identity, None)
    cache = TokenCache.open(root)
    if stored is not None and stored["finished"]:
        if not background:
            return cache
        already_done = BuildHandle(cache, threading.Thread(target=lambda: None))
        already_done.thread.start()
        return already_done
    if num_workers is None:
        num_workers = default_num_workers()
    share = list(range(host_index, len(shards), host_count))
    jobs = [
        ShardJob(
            root, index, shards[index], chunk_tokens, first_chunk_tokens, strict, described=described[index]
        )
        for index in share
        if not shard_is_finished(root, index)
    ]
    stop_requested = threading.Event()

    def run() -> None:
        # Hosts build disjoint shares, so each share has its own lock (two builds of one share wait).
        with build_lock(root, "" if host_count == 1 else f"{host_index}-of-{host_count}"):
            build_pending()

    def build_pending() -> None:
        # Shards another builder finished while this one waited for the lock are not built again.
        pending = [job for job in jobs if not shard_is_finished(root, job.shard_index)]
        bar = BuildProgress(root, len(shards), enabled=progress)

        def poll() -> None:
            bar.poll()
            if stop_requested.is_set():
                raise BuildStopped(f"the build of {root} was stopped; building it again resumes it")

        try:
            if builder == "local":
                run_local(pending, processor, num_workers, poll=poll, poll_seconds=0.5, niceness=niceness)
            else:
                run_ray(
                    pending,
                    processor,
                    ray_address=ray_address,
                    num_workers=num_workers or None,
                    poll=poll,
                    poll_seconds=0.5,
                )
        finally:
            bar.close()
        finished = [ShardProgress.load(root, index) for index in range(len(shards))]
        if all(shard is not None and shard.finished for shard in finished):
            # With several hosts, each checks after saving its own shards: the last to finish sees all.
            save_cache_ledger(root, identity, finished)  # type: ignore[arg-type]
        else:
            assert host_count > 1, "a shard of a single-host build did not finish"

    if not background:
        run()
        cache.refresh()
        return cache
    handle = BuildHandle(cache, threading.Thread(), shards=share, stop_requested=stop_requested)
    # Reads that wait for tokens this build will never write (it failed) raise its error instead.
    cache.build_errors = handle.errors

    def run_in_background() -> None:
        try:
            run()
        except BuildStopped:
            pass
        except BaseException as error:
            handle.errors.append(error)

    handle.thread = threading.Thread(target=run_in_background, name=f"halyard.data build {root}", daemon=True)
    handle.thread.start()
    return handle


def _with_tokenizer_template(spec: SourceSpec, tokenizer: TokenizerSpec) -> SourceSpec:
    if spec.example is None:
        return spec
    example = spec.example.with_tokenizer_template(
        tokenizer.chat_template, tokenizer.bos_token, tokenizer.eos_token, tokenizer.source
    )
    return dataclasses.replace(spec, example=example)


def _delete_cache(root: str) -> None:
    fs, path = fsspec.core.url_to_fs(root)
    if fs.protocol == "file" or "file" in fs.protocol:
        shutil.rmtree(path)
    else:
        fs.rm(path, recursive=True)
