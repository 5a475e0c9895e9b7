"""The command line: ``python -m halyard.data build ...`` and ``python -m halyard.data info CACHE``."""

from __future__ import annotations

import argparse
import json
import os
import sys

from halyard.data.builders.build import DEFAULT_CHUNK_TOKENS, DEFAULT_FIRST_CHUNK_TOKENS, build_cache
from halyard.data.cache.reader import TokenCache
from halyard.data.errors import DataInputError
from halyard.data.examples.formats import CHAT_TEMPLATES, EXAMPLE_KINDS, ExampleFormat
from halyard.data.sources.shards import FORMATS


def _special(value: str) -> bool | str:
    lowered = value.lower()
    if lowered in ("true", "yes", "on"):
        return True
    if lowered in ("false", "no", "off"):
        return False
    return value


def make_parser() -> argparse.ArgumentParser:
    """The argument parser (also what a ``halyard cache`` wrapper can reuse)."""
    parser = argparse.ArgumentParser(
        prog="python -m halyard.data", description="Build and inspect halyard token caches."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="tokenize sources into a cache (resumes an interrupted build)")
    build.add_argument(
        "--source",
        action="append",
        required=True,
        help="path/URL pattern with braces and globs, or a folder; repeat for more sources",
    )
    build.add_argument("--tokenizer", required=True, help="tokenizer.json path/URL or a tokenizer folder")
    build.add_argument("--out", required=True, help="the cache folder (local path or fsspec URL)")
    build.add_argument(
        "--format", default="auto", choices=("auto", *FORMATS), help="source format (default: by suffix)"
    )
    build.add_argument(
        "--text-field", default="text", help="JSON key or column with the text (default: text)"
    )
    build.add_argument(
        "--text-mode",
        default="document",
        choices=("document", "line"),
        help="text files: one document per file or per line",
    )
    build.add_argument(
        "--example-format",
        default="text",
        choices=EXAMPLE_KINDS,
        help="what each record holds: text (documents, every token trained on), chat (a message list; "
        "only assistant turns are trained on), prompt_completion (only the completion is) or preference "
        "(prompt, chosen, rejected: two examples, only the replies trained on); all but text store a loss "
        "mask and read jsonl/json",
    )
    build.add_argument("--messages-field", default="messages", help="chat: key of the message list")
    build.add_argument("--role-field", default="role", help="chat: key of a message's role")
    build.add_argument("--content-field", default="content", help="chat: key of a message's text")
    build.add_argument(
        "--prompt-field", default="prompt", help="prompt_completion, preference: key of the prompt"
    )
    build.add_argument(
        "--completion-field", default="completion", help="prompt_completion: key of the completion"
    )
    build.add_argument("--chosen-field", default="chosen", help="preference: key of the preferred reply")
    build.add_argument(
        "--rejected-field", default="rejected", help="preference: key of the dispreferred reply"
    )
    build.add_argument(
        "--chat-template",
        default="simple",
        choices=CHAT_TEMPLATES,
        help="chat, preference: simple (plain-text role markers, see ExampleFormat), tokenizer (the "
        "tokenizer's own chat_template) or auto (the tokenizer's when it has one, else simple)",
    )
    build.add_argument(
        "--bos", default="auto", type=_special, help="auto | true | false | <token> (default: auto)"
    )
    build.add_argument("--eos", default="auto", type=_special, help="auto | <token> (default: auto)")
    build.add_argument(
        "--chunk-tokens", type=int, default=DEFAULT_CHUNK_TOKENS, help="target tokens per chunk"
    )
    build.add_argument(
        "--first-chunk-tokens",
        type=int,
        default=DEFAULT_FIRST_CHUNK_TOKENS,
        help="target tokens of a shard's first chunk (doubling up to --chunk-tokens)",
    )
    build.add_argument("--split-chars", type=int, default=100_000, help="tokenize longer documents in pieces")
    build.add_argument(
        "--strict", action="store_true", help="fail on malformed records instead of counting them"
    )
    build.add_argument(
        "--workers", type=int, default=None, help="processes (default: one per CPU; 0: in-process)"
    )
    build.add_argument(
        "--ray", action="store_true", help="build with Ray tasks (a local Ray unless --ray-address)"
    )
    build.add_argument("--ray-address", default=None, help="Ray cluster address (implies --ray)")
    build.add_argument("--rebuild", action="store_true", help="replace a cache built with other settings")
    build.add_argument("--no-progress", action="store_true", help="no progress bar")
    info = commands.add_parser("info", help="print a cache's settings, progress and bad-record counters")
    info.add_argument("cache", help="the cache folder or URL")
    info.add_argument("--json", action="store_true", help="print JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status: 2 after printing one line for bad input (a source
    matching nothing, a broken tokenizer, a bad record under --strict), unless ``HALYARD_DEBUG=1`` asks
    for the traceback."""
    try:
        return run_command(argv)
    except DataInputError as error:
        if os.environ.get("HALYARD_DEBUG", "").strip().lower() not in ("", "0", "false", "no"):
            raise
        message = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
        print(f"error: {message}", file=sys.stderr)
        return 2


def run_command(argv: list[str] | None = None) -> int:
    """`main` without the error handling: bad input raises its `DataInputError` (for a wrapping CLI)."""
    args = make_parser().parse_args(argv)
    if args.command == "build":
        cache = build_cache(
            args.source,
            args.tokenizer,
            args.out,
            text_field=args.text_field,
            format=args.format,
            text_mode=args.text_mode,
            example_format=ExampleFormat(
                kind=args.example_format,
                messages_field=args.messages_field,
                role_field=args.role_field,
                content_field=args.content_field,
                prompt_field=args.prompt_field,
                completion_field=args.completion_field,
                chosen_field=args.chosen_field,
                rejected_field=args.rejected_field,
                chat_template=args.chat_template,
            ),
            bos=args.bos,
            eos=args.eos,
            chunk_tokens=args.chunk_tokens,
            first_chunk_tokens=args.first_chunk_tokens,
            split_chars=args.split_chars,
            strict=args.strict,
            num_workers=args.workers,
            builder="ray" if args.ray or args.ray_address else "local",
            ray_address=args.ray_address,
            rebuild=args.rebuild,
            progress=not args.no_progress,
        )
        assert isinstance(cache, TokenCache)
        print(
            f"{cache.root}: {cache.num_documents} documents, {cache.num_tokens} tokens, fingerprint {cache.fingerprint}"
        )
        return 0
    cache = TokenCache.open(args.cache)
    summary = describe(cache)
    if args.json:
        print(json.dumps(summary, indent=1, sort_keys=True))
    else:
        for key, value in summary.items():
            print(f"{key}: {value}")
    return 0


def describe(cache: TokenCache) -> dict[str, object]:
    """A plain summary of a cache: identity, progress, totals and bad-record counters."""
    progress = cache.shard_progress()
    counters: dict[str, int] = {}
    for shard in progress:
        for name, count in shard.counters.items():
            counters[name] = counters.get(name, 0) + count
    return {
        "path": cache.root,
        "fingerprint": cache.fingerprint,
        "finished": cache.is_finished,
        "shards": len(cache.identity["shards"]),
        "shards_finished": sum(shard.finished for shard in progress),
        "documents": cache.num_documents,
        "tokens": cache.num_tokens,
        "token_dtype": cache.token_dtype.name,
        "loss_mask": cache.has_loss_mask,
        "chunk_tokens": cache.identity["chunk_tokens"],
        "processor": cache.processor_metadata,
        "bad_records": counters,
    }


if __name__ == "__main__":
    sys.exit(main())
