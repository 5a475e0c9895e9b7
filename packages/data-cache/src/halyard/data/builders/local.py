"""The local builder: shards tokenized by a pool of processes on this machine (or in this process)."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool

from halyard.data.builders.shard_worker import ShardJob, build_shard
from halyard.data.processing.processor import Processor

# Set once per worker process by the pool initializer, so the tokenizer (megabytes of JSON) is sent once
# per worker instead of once per shard.
_WORKER_PROCESSOR: Processor | None = None


def default_num_workers() -> int:
    """One worker per CPU this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def refuse_while_importing_main(what: str = "build_cache") -> None:
    """Fail in a ``spawn`` worker that is re-importing the main script, instead of waiting forever.

    A script that calls ``build_cache`` (or ``Trainer(...).fit()``) at top level runs that call again in
    every worker process while the worker imports it (``spawn`` imports the main script); the nested
    build would wait for the parent's build lock, and the parent for its workers, forever.

    Raises:
        RuntimeError: when called while this process imports the main script for ``spawn``.
    """
    # multiprocessing's own check (spawn._check_not_importing_main) reads the same flag.
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise RuntimeError(
            f"{what} was called while a builder worker process imported the main script: put the script's "
            "top-level code under `if __name__ == '__main__':` (worker processes are started with "
            "'spawn' and import the main script again), or build in this process with num_workers=0."
        )


def unimportable_main_script() -> str | None:
    """The main script's name when ``spawn`` workers could not import it (read from standard input:
    ``python - <<EOF``), else None (a file, a module run with ``-m``, ``-c``, an interactive session)."""
    main = sys.modules.get("__main__")
    if main is None or getattr(main, "__spec__", None) is not None:
        return None
    path = getattr(main, "__file__", None)
    if path is None:  # spawn imports nothing in the workers
        return None
    original_dir = getattr(multiprocessing.process, "ORIGINAL_DIR", None) or ""  # where spawn looks
    return None if os.path.isfile(os.path.join(original_dir, path)) else path


def _initialize_worker(processor_path: str, tokenizer_threads: int, niceness: int) -> None:
    global _WORKER_PROCESSOR
    with open(processor_path, "rb") as file:
        processor: Processor = pickle.load(file)
    if niceness:
        os.nice(niceness)
    # The tokenizer's thread pool reads this when first used; one thread per worker avoids oversubscription.
    os.environ["RAYON_NUM_THREADS"] = str(tokenizer_threads)
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    _WORKER_PROCESSOR = processor
    processor.backend  # noqa: B018 - build the tokenizer before the first shard arrives


def _run_job(job: ShardJob) -> int:
    assert _WORKER_PROCESSOR is not None, "worker started without its initializer"
    build_shard(job, _WORKER_PROCESSOR)
    return job.shard_index


def run_local(
    jobs: list[ShardJob],
    processor: Processor,
    num_workers: int,
    poll: Callable[[], None],
    poll_seconds: float,
    niceness: int = 0,
) -> None:
    """Build ``jobs`` with ``num_workers`` processes (0: in this process, one shard after another).

    Workers are started with ``spawn`` (safe inside a multi-threaded training process), so a script that
    calls this must guard its entry point with ``if __name__ == "__main__":``.

    Shards are submitted in index order, so the first shards finish first and the readable prefix grows
    early. At most ``num_workers`` shards are in flight (each holds at most one chunk in memory).

    Args:
        jobs: the unfinished shards.
        processor: the tokenizer and policy (sent once to each worker).
        num_workers: worker processes; 0 runs in-process (needed for ``memory://`` caches in tests).
        poll: called every ``poll_seconds`` while waiting (progress display).
        poll_seconds: see ``poll``.
        niceness: added to the workers' scheduling niceness (a build beside training yields the CPU to it).

    Raises:
        the first exception a shard raised (other shards are cancelled).
    """
    if not jobs:
        return
    script = unimportable_main_script() if num_workers else None
    if script is not None:
        where = "was read from standard input" if script == "<stdin>" else "is no file"
        print(
            f"halyard.data: the main script {where} ({script}), which builder worker processes cannot import: "
            "tokenizing in this process instead",
            file=sys.stderr,
            flush=True,
        )
        num_workers = 0
    if num_workers == 0:
        for job in jobs:
            build_shard(job, processor)
            poll()
        return
    # Fewer shards than workers: fewer processes, each tokenizing with more threads, so all cores work.
    num_workers = max(1, min(num_workers, len(jobs)))
    threads = max(1, default_num_workers() // num_workers)
    # The processor (megabytes of tokenizer JSON) goes to the workers through a file, not the spawn pipe:
    # a worker that dies while importing the main script stops reading that pipe, and a parent writing
    # more than the pipe holds would then wait forever instead of seeing the pool break.
    with tempfile.TemporaryDirectory(prefix="halyard-build-") as folder:
        processor_path = os.path.join(folder, "processor.pickle")
        with open(processor_path, "wb") as file:
            pickle.dump(processor, file)
        _run_pool(jobs, processor_path, num_workers, threads, niceness, poll, poll_seconds)


def _run_pool(
    jobs: list[ShardJob],
    processor_path: str,
    num_workers: int,
    threads: int,
    niceness: int,
    poll: Callable[[], None],
    poll_seconds: float,
) -> None:
    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(
        max_workers=num_workers,
        mp_context=context,
        initializer=_initialize_worker,
        initargs=(processor_path, threads, niceness),
    )
    with pool:
        with _stop_signals_blocked():  # the workers start at the first submit, inheriting the mask
            pending: set[Future[int]] = {pool.submit(_run_job, job) for job in jobs}
        try:
            while pending:
                done, pending = wait(pending, timeout=poll_seconds, return_when=FIRST_COMPLETED)
                for future in done:
                    future.result()
                poll()
        except BrokenProcessPool as error:
            for future in pending:
                future.cancel()
            raise RuntimeError(
                "a builder worker process died. If it died at start and build_cache was called from a script, "
                "put the call under `if __name__ == '__main__':` (worker processes are started with 'spawn' "
                "and import the main script again), or pass num_workers=0 to build in this process. If it "
                "died later, it was killed (out of memory?); run the same build again to resume it."
            ) from error
        except BaseException:
            # Stopped (or failed): do not wait for the shards in flight, which may take minutes; their
            # committed chunks stay and a later build resumes them. The executor has no public way to
            # end its workers before Python 3.14 (terminate_workers); it then fails the pending futures
            # itself (cancelling them first makes its manager thread raise InvalidStateError). SIGKILL:
            # the workers block SIGTERM.
            for process in list(getattr(pool, "_processes", {}).values()):
                process.kill()
            raise


@contextlib.contextmanager
def _stop_signals_blocked() -> Iterator[None]:
    """Block SIGINT and SIGTERM in this thread meanwhile, so that worker processes started here block them
    for good (a signal mask is inherited): a Ctrl-C or SIGTERM sent to the whole process group then reaches
    the parent alone, which stops the build (or, training, saves first) instead of workers dying mid-import."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
