"""Turn user-facing source patterns (paths, URLs, braces, globs, folders) into an ordered list of files."""

from __future__ import annotations

import re

import fsspec

from halyard.data.errors import SourceNotFoundError

_BRACE = re.compile(r"\{([^{}]*)\}")
_NUMERIC_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")
_GLOB_CHARS = ("*", "?", "[")


def expand_braces(pattern: str) -> list[str]:
    """Expand shell-style braces: ``a{1,2}b`` -> ``a1b, a2b`` and ``x{00..02}`` -> ``x00, x01, x02``.

    Args:
        pattern: a path or URL that may contain ``{a,b,...}`` lists or ``{start..end}`` integer ranges
            (zero padding follows the width of ``start``). Nested braces expand left to right.

    Returns:
        The expansions in the order written (ranges ascending or descending as written).
    """
    match = _BRACE.search(pattern)
    if match is None:
        return [pattern]
    body = match.group(1)
    numeric = _NUMERIC_RANGE.match(body)
    if numeric is not None:
        start, end = int(numeric.group(1)), int(numeric.group(2))
        width = len(numeric.group(1)) if numeric.group(1).startswith("0") else 0
        step = 1 if end >= start else -1
        options = [str(value).zfill(width) for value in range(start, end + step, step)]
    else:
        options = body.split(",")
    head, tail = pattern[: match.start()], pattern[match.end() :]
    return [expanded for option in options for expanded in expand_braces(head + option + tail)]


def expand_urls(patterns: str | list[str] | tuple[str, ...]) -> list[str]:
    """Resolve patterns to a deduplicated, ordered list of file URLs.

    Each pattern is brace-expanded, then glob-expanded through fsspec (sorted), and a folder expands to
    the files directly inside it (sorted, hidden files excluded). A folder saved by Hugging Face
    ``datasets.save_to_disk`` is kept as one entry (its arrow files are listed by the HF reader).

    Args:
        patterns: one pattern or a list; local paths or any fsspec URL (``gs://``, ``s3://``, ``https://``,
            ``memory://``).

    Raises:
        FileNotFoundError: a pattern matches nothing; the message names the pattern.
    """
    if isinstance(patterns, str):
        patterns = [patterns]
    urls: list[str] = []
    for pattern in patterns:
        for expanded in expand_braces(pattern):
            matches = _expand_one(expanded)
            if not matches:
                raise SourceNotFoundError(
                    f"source {expanded!r} (from pattern {pattern!r}) matches no file; check the path, "
                    "the glob and the credentials of the filesystem"
                )
            urls.extend(matches)
    seen: set[str] = set()
    ordered = []
    for url in urls:
        if url not in seen:
            seen.add(url)
            ordered.append(url)
    return ordered


def _expand_one(url: str) -> list[str]:
    fs, path = fsspec.core.url_to_fs(url)
    if any(char in path for char in _GLOB_CHARS):
        found = sorted(fs.glob(path))
        return [_with_protocol(fs, url, item) for item in found if not fs.isdir(item)]
    if not fs.exists(path):
        return []
    if fs.isdir(path):
        if is_hf_dataset_folder(url):
            return [_with_protocol(fs, url, path)]
        children = sorted(fs.ls(path, detail=False))
        return [
            _with_protocol(fs, url, child)
            for child in children
            if not child.rstrip("/").rsplit("/", 1)[-1].startswith(".") and not fs.isdir(child)
        ]
    # Local paths come back absolute, so the cache identity does not depend on the working directory.
    return [_with_protocol(fs, url, path)]


def _with_protocol(fs: fsspec.AbstractFileSystem, original: str, path: str) -> str:
    if "://" not in original:
        return path
    return fs.unstrip_protocol(path)


def is_hf_dataset_folder(url: str) -> bool:
    """True when ``url`` is a folder written by ``datasets.Dataset.save_to_disk`` (it has ``state.json``)."""
    fs, path = fsspec.core.url_to_fs(url)
    return fs.isdir(path) and fs.exists(path.rstrip("/") + "/state.json")
