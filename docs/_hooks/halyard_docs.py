"""MkDocs hook: pages generated at build time, so that what the site shows is what the code does.

- Every guide `docs/guides/*.py` (a script in the "percent" cell format of jupytext: `# %% [markdown]`
  cells of comment lines, `# %%` code cells) becomes the page `guides/<name>.md`. The script itself is
  copied next to it, so a reader can download and run exactly what the page shows.
- Figures: the guides save their plots into `docs/guides/figures/`; when `HALYARD_DOCS_FIGURES` names
  another folder (the docs test runs the guides at smoke size into a temporary one), its PNGs replace them.
- `concepts/config.md`: the config reference, walked from the `TrainConfig` dataclasses and their
  attribute docstrings (the same text `train --help` prints).
- `packages/<name>.md`: each package README, its links between READMEs rewritten to site pages.
- `concepts/performance.md`: `benchmarks/README.md` when it exists, and its history `concepts/performance-history.md`.
"""

from __future__ import annotations

import inspect
import os
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("named", "shard", "data-cache", "models", "export", "serve", "train")
MARKDOWN_CELL = re.compile(r"^# %%.*\[markdown\]")
CODE_CELL = re.compile(r"^# %%")
LINK = re.compile(r"(?<!!)\[([^\]]*)\]\(([^)\s]+)\)")


def script_to_markdown(source: str, script_name: str) -> str:
    """The page of a percent-format script: markdown cells as text, code cells as Python blocks.

    Args:
        source: the script's text.
        script_name: the file name shown in the download note.
    """
    cells: list[tuple[str, list[str]]] = [("code", [])]
    for line in source.splitlines():
        if MARKDOWN_CELL.match(line):
            cells.append(("markdown", []))
        elif CODE_CELL.match(line):
            cells.append(("code", []))
        else:
            cells[-1][1].append(line)
    parts: list[str] = []
    for kind, lines in cells:
        text = "\n".join(lines).strip("\n")
        if not text.strip():
            continue
        if kind == "markdown":
            parts.append("\n".join(re.sub(r"^# ?", "", line) for line in text.splitlines()))
        else:
            text = text.replace("  # fmt: skip", "")  # formatter hints mean nothing to a reader
            parts.append(f"```python\n{text}\n```")
    note = (
        f'!!! note "This page is a script"\n    Generated from [`{script_name}`]({script_name}), which CI runs '
        f"on every change (at smoke size). Run it yourself with `python docs/guides/{script_name}` from "
        "the repository root; set `HALYARD_DOCS_SMOKE=1` for the smallest sizes."
    )
    if parts and parts[0].startswith("# "):
        title, _, rest = parts[0].partition("\n")
        return "\n\n".join([title, note, rest.strip(), *parts[1:]]) + "\n"
    return "\n\n".join([note, *parts]) + "\n"


def readme_page(readme: Path, pages: dict[Path, str], page_uri: str) -> str:
    """A README as a site page: links to other READMEs and to pages under docs/ point at their pages; links to
    other repository files become their path in code font (the site holds only pages).

    Args:
        readme: the README file.
        pages: README path -> the page URI it becomes.
        page_uri: the URI of this page (for relative links).
    """
    depth = page_uri.count("/")

    def rewrite(match: re.Match[str]) -> str:
        text, target = match.group(1), match.group(2)
        if "://" in target or target.startswith(("#", "mailto:")):
            return match.group(0)
        path, _, anchor = target.partition("#")
        resolved = (readme.parent / path).resolve()
        docs = REPO / "docs"
        if resolved in pages or (resolved.suffix == ".md" and resolved.is_relative_to(docs)):
            uri = pages.get(resolved) or resolved.relative_to(docs).as_posix()
            return f"[{text}]({'../' * depth}{uri}{'#' + anchor if anchor else ''})"
        try:
            shown = resolved.relative_to(REPO)
        except ValueError:
            shown = Path(path)
        return f"{text} (`{shown}`)" if text.strip("`") != str(shown) else f"`{shown}`"

    return LINK.sub(rewrite, readme.read_text())


def _add(files: Files, config: Any, uri: str, content: str | bytes) -> None:
    existing = files.get_file_from_path(uri)
    if existing is not None:
        files.remove(existing)
    files.append(File.generated(config, uri, content=content))


def on_files(files: Files, config: Any) -> Files:
    """Add the generated pages and figures to the site."""
    docs_dir = Path(config["docs_dir"])
    for script in sorted((docs_dir / "guides").glob("*.py")):
        _add(files, config, f"guides/{script.stem}.md", script_to_markdown(script.read_text(), script.name))
    figures = os.environ.get("HALYARD_DOCS_FIGURES")
    if figures:
        for png in sorted(Path(figures).glob("*.png")):
            _add(files, config, f"guides/figures/{png.name}", png.read_bytes())
    _add(files, config, "concepts/config.md", config_reference())

    pages = {REPO / "packages" / name / "README.md": f"packages/{name}.md" for name in PACKAGES}
    benchmarks = REPO / "benchmarks" / "README.md"
    if benchmarks.exists():
        pages[benchmarks] = "concepts/performance.md"
        pages[benchmarks.with_name("HISTORY.md")] = "concepts/performance-history.md"
    pages[REPO / "packages/train/src/halyard/train/checkpoint/README.md"] = "concepts/checkpoints.md"
    pages[REPO / "README.md"] = "index.md"
    for readme, uri in pages.items():
        if uri != "index.md" and readme.exists():
            _add(files, config, uri, readme_page(readme, pages, uri))
    if not benchmarks.exists():
        _add(files, config, "concepts/performance.md", performance_page())
    if files.get_file_from_path("reliability.md") is None:
        # docs/reliability.md is written separately; until it lands the site says where the facts are.
        _add(
            files,
            config,
            "reliability.md",
            "# Reliability guarantees\n\nSee [checkpoints](concepts/checkpoints.md) (the commit protocol, "
            "preemption) and the [data cache](packages/data-cache.md#determinism-guarantees) (byte-identical "
            "builds, deterministic batches).\n",
        )
    return files


def performance_page() -> str:
    """`concepts/performance.md` while `benchmarks/README.md` does not exist: every benchmark script with
    the first line of its docstring, and the headline numbers of each recorded result."""
    import ast
    import json

    lines = [
        "# Performance",
        "Every benchmark is a script in `benchmarks/` that measures Halyard against a baseline in the same "
        "run and prints the ratio (so the figures hold on any machine); `python benchmarks/run_all.py` runs "
        "them all and prints one table, `--quick` runs them at smoke size (CI does).",
        "| script | what it measures |\n|---|---|",
    ]
    for script in sorted((REPO / "benchmarks").rglob("*.py")):
        doc = ast.get_docstring(ast.parse(script.read_text())) or ""
        lines[-1] += (
            f"\n| `{script.relative_to(REPO)}` | {_cell(doc.strip().splitlines()[0] if doc else '')} |"
        )
    results = sorted((REPO / "benchmarks" / "results").glob("*.json"))
    if results:
        lines.append("## Recorded results\n\nHeadline values of the last full runs (`benchmarks/results/`):")
    for result in results:
        data = json.loads(result.read_text())
        scalars = {k: v for k, v in data.items() if isinstance(v, int | float | str) and len(str(v)) < 60}
        table = "\n".join(
            f"| `{k}` | {_cell(str(round(v, 4) if isinstance(v, float) else v))} |"
            for k, v in scalars.items()
        )
        lines.append(f"### `{result.name}`\n\n| field | value |\n|---|---|\n{table}")
    return "\n\n".join(lines) + "\n"


# -- the config reference -----------------------------------------------------------------------------


def _field_doc(cls: type, name: str) -> str:
    from draccus.wrappers.docstring import get_attribute_docstring

    for klass in cls.__mro__:
        if name in inspect.get_annotations(klass):
            try:
                doc = get_attribute_docstring(klass, name)
            except IndexError:  # draccus reads past the end of a class whose last field has no docstring
                return ""
            text = doc.docstring_below or doc.comment_inline or doc.comment_above
            if text.strip():
                return " ".join(text.split())
    for klass in cls.__mro__:
        described = _docstring_fields(klass.__dict__.get("__doc__") or "")
        if name in described:
            return described[name]
    return ""


def _docstring_fields(docstring: str) -> dict[str, str]:
    """`name: text` entries of the `Attributes:` / `Args:` section of a Google-style class docstring."""
    fields: dict[str, str] = {}
    current: str | None = None
    in_section = False
    for line in docstring.splitlines():
        stripped = line.strip()
        if stripped in ("Attributes:", "Args:", "Fields:"):
            in_section, current = True, None
            continue
        if not in_section:
            continue
        entry = re.match(r"^(\w+)(?: \([^)]*\))?: (.*)$", stripped)
        if entry and len(line) - len(line.lstrip()) <= 8:
            current = entry.group(1)
            fields[current] = entry.group(2)
        elif stripped and current is not None:
            fields[current] += " " + stripped
        elif not stripped:
            current = None
    return fields


def _default(field: Any) -> Any:
    import dataclasses

    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _rows(cls: type, prefix: str, instance: Any = None) -> list[str]:
    """Table rows `| key | type | default | meaning |` of a dataclass, nested dataclasses flattened."""
    import dataclasses

    from halyard.train.config.schema import dataclass_in, is_choice_section

    rows = []
    for field in dataclasses.fields(cls):
        if not field.init:
            continue
        key = f"{prefix}{field.name}"
        value = getattr(instance, field.name) if instance is not None else _default(field)
        nested = dataclass_in(field.type) if not isinstance(field.type, str) else None
        if nested is None and dataclasses.is_dataclass(value) and not isinstance(value, type):
            nested = type(value)
        if nested is not None and not is_choice_section(nested) and dataclasses.is_dataclass(value):
            rows.extend(_rows(type(value), f"{key}.", value))
            continue
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            shown = f"`type: {getattr(value, 'type', type(value).__name__)}`"
        elif value is dataclasses.MISSING:
            shown = "required"
        else:
            shown = f"`{value!r}`"
        type_text = str(field.type).replace("typing.", "")
        rows.append(
            f"| `{key}` | `{_cell(type_text)}` | {_cell(shown)} | {_cell(_field_doc(cls, field.name))} |"
        )
    return rows


def _table(cls: type, prefix: str, instance: Any = None) -> str:
    header = "| key | type | default | meaning |\n|---|---|---|---|"
    return header + "\n" + "\n".join(_rows(cls, prefix, instance))


def _choices(base: type) -> dict[str, type]:
    return dict(sorted(base.get_known_choices().items()))


def config_reference() -> str:
    """The page `concepts/config.md`: every key of `TrainConfig`, generated from the dataclasses."""
    import dataclasses

    from halyard.models import ModelConfig
    from halyard.train.optim.config import OptimizerConfig
    from halyard.train.run_config import TrainConfig
    from halyard.train.trackers.config import TrackerConfig

    parts = [
        "# Config reference",
        "This page is generated from the `TrainConfig` dataclasses (`halyard.train.run_config`) when the "
        "site is built, so it lists exactly the keys the code accepts, with the same text as "
        "`train --help`. A YAML file sets any of them by section (`trainer: {steps: 100}`), the command "
        "line by dotted key (`--trainer.steps 100`). Precedence: class defaults < `--config FILE` "
        "(files may `include:` others) < `--key value`. Sections chosen by `type:` list the keys of each "
        "choice.",
    ]
    root_docs = {field.name: _field_doc(TrainConfig, field.name) for field in dataclasses.fields(TrainConfig)}
    defaults = TrainConfig()
    for field in dataclasses.fields(TrainConfig):
        name = field.name
        value = getattr(defaults, name)
        doc = root_docs[name] or " ".join((type(value).__doc__ or "").split())
        parts.append(f"## `{name}`\n\n{doc}")
        if name == "model":
            for choice, cls in _choices(ModelConfig).items():
                summary = (cls.__doc__ or "").strip().split("\n")[0]
                parts.append(f"### `model.type: {choice}`\n\n{summary}\n\n{_table(cls, 'model.')}")
        elif name == "optimizer":
            for choice, cls in _choices(OptimizerConfig).items():
                parts.append(f"### `optimizer.type: {choice}`\n\n{_table(cls, 'optimizer.')}")
            schedule_base = type(defaults.optimizer.schedule).__mro__[1]
            for choice, cls in _choices(schedule_base).items():
                parts.append(
                    f"### `optimizer.schedule.type: {choice}`\n\n{_table(cls, 'optimizer.schedule.')}"
                )
        elif name == "trackers":
            parts.append("A list; each entry is one of:")
            for choice, cls in _choices(TrackerConfig).items():
                parts.append(f"### `trackers: - type: {choice}`\n\n{_table(cls, '')}")
        else:
            parts.append(_table(type(value), f"{name}.", value))
    return "\n\n".join(parts) + "\n"
