"""Install Halyard on a machine without network (a TPU VM) from a folder of wheels built where pip works.

Here, with the package registries and ``make venv`` done (``.whl-tpu/`` is git-ignored)::

    .venv/bin/python tools/tpu_install.py build                 # .whl-tpu/: Halyard's wheels + the rest

There, where ``python3`` already has JAX with libtpu and a package index lies on disk
(``file:///opt/pypi/simple`` on the one-chip TPU v5e machine; ../shared/TPU.md)::

    eval "$(python3 tools/tpu_install.py install)"               # prints the exports that eval runs

``build`` writes Halyard's own wheels (tools/wheelhouse.py) and downloads, for CPython 3.11 on x86-64
manylinux, every distribution they need that neither the machine (`MACHINE`) nor its index (`INDEX`)
holds, each at the version this environment runs (``carried_requirements``). ``install`` puts the
wheels under ``--target``/carried with ``--no-index --no-deps`` (nothing is fetched), then `INDEX`
from the machine's own index under ``--target``/index, and prints ``export PYTHONPATH=...`` (the
machine's JAX stays first) and ``export PATH=...`` (the ``train`` and ``halyard`` commands) on stdout;
its progress goes to stderr. A second ``install`` of the same wheels returns at once.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_WHEELS = ROOT / ".whl-tpu"
DEFAULT_TARGET = Path("/tmp/halyard")
DEFAULT_INDEX = "file:///opt/pypi/simple"

MACHINE = ("jax", "jaxlib", "libtpu", "numpy", "scipy", "ml-dtypes", "opt-einsum", "sympy", "mpmath")
"""Installed with the machine's python3 (JAX 0.10.2 with libtpu on PYTHONPATH): never carried, never
replaced."""
INDEX = (
    "optax", "orbax-checkpoint", "tensorstore", "jaxtyping", "einops", "safetensors", "tokenizers",
    "pyarrow", "pyyaml", "tqdm", "typing-extensions", "protobuf", "packaging", "matplotlib", "ml-dtypes",
    "pytest-timeout",
)  # fmt: skip
"""Installed, with what they need, from the machine's own package index (what TPU.md's install used)."""
LEFT_OUT = {
    "wandb": "a tracker that syncs to a server, which a machine without network cannot reach; the jsonl "
    "and tensorboard trackers need nothing more",
}
"""Declared dependencies not carried: the commands import them only when a config asks for them."""
PLATFORMS = (
    "manylinux_2_35_x86_64",
    "manylinux_2_34_x86_64",
    "manylinux_2_31_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
)
"""Wheels the machine (glibc 2.36, x86-64) runs; pip matches each tag exactly."""


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def carried_requirements() -> list[str]:
    """``name==version`` of every distribution to carry: what Halyard's packages need, transitively (as this
    environment's metadata says, for CPython 3.11 on Linux), except `MACHINE`, `INDEX`, `LEFT_OUT` and
    Halyard's own.

    Raises:
        SystemExit: a needed distribution is not installed here (run ``make venv`` first).
    """
    import importlib.metadata

    from packaging.requirements import Requirement

    sys.path.insert(0, str(ROOT / "tools"))
    import wheelhouse

    stop = {_canonical(name) for name in (*MACHINE, *INDEX, *LEFT_OUT)}
    todo = [r for package in wheelhouse.read_packages().values() for r in package.requirements]
    environment = {"python_version": "3.11", "sys_platform": "linux", "platform_system": "Linux", "extra": ""}
    found: dict[str, str] = {}
    while todo:
        requirement = todo.pop()
        name = _canonical(requirement.name)
        if name.startswith("halyard-") or name in stop or name in found:
            continue
        if requirement.marker is not None and not requirement.marker.evaluate(environment):
            continue
        try:
            distribution = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            raise SystemExit(
                f"{name} (needed on the TPU machine) is not installed here: run make venv"
            ) from None
        found[name] = distribution.version
        todo.extend(Requirement(line) for line in distribution.requires or [])
    return [f"{name}=={version}" for name, version in sorted(found.items())]


def build(wheels: Path, download: bool = True) -> list[Path]:
    """Fill ``wheels`` (emptied of older wheels first) with Halyard's wheels and, with ``download``, the
    carried distributions' wheels; returns the folder's wheels."""
    sys.path.insert(0, str(ROOT / "tools"))
    import wheelhouse

    packages = wheelhouse.read_packages()
    errors = wheelhouse.range_errors(packages)
    if errors:
        raise SystemExit("\n".join(errors))
    wheels.mkdir(parents=True, exist_ok=True)
    for stale in wheels.glob("*.whl"):  # two versions of one distribution stop the whole install
        stale.unlink()
    with tempfile.TemporaryDirectory() as scratch:
        for built in wheelhouse.build(Path(scratch), packages):
            if built.suffix == ".whl":
                built.rename(wheels / built.name)
    if download:
        platforms = [argument for tag in PLATFORMS for argument in ("--platform", tag)]
        command = [
            sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
            "--python-version", "3.11", "--implementation", "cp", *platforms, "--dest", str(wheels),
            *carried_requirements(),
        ]  # fmt: skip
        subprocess.run(command, check=True)
    return sorted(wheels.glob("*.whl"))


def _pip(*arguments: str) -> None:
    """``python3 -m pip install`` with no user or site configuration (a machine's pip.conf may name an
    index it cannot reach)."""
    command = [sys.executable, "-m", "pip", "install", "--isolated", "--quiet", "--no-cache-dir", *arguments]
    environment = dict(os.environ, PIP_CONFIG_FILE=os.devnull)
    subprocess.run(command, check=True, env=environment, stdout=sys.stderr)


def exports(target: Path) -> str:
    """The shell lines that make the installed packages and commands visible, after what is there."""
    paths = f"{target / 'carried'}:{target / 'index'}"
    return f'export PYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{paths}"\nexport PATH="{target / "carried" / "bin"}:$PATH"'


def install(wheels: Path, target: Path, index_url: str | None) -> str:
    """Install ``wheels``/*.whl offline, then `INDEX` from ``index_url`` (None: skip it); returns `exports`.

    Raises:
        SystemExit: no wheels in ``wheels``, or ``index_url`` is a folder that does not exist.
    """
    found = sorted(wheels.glob("*.whl"))
    if not found:
        raise SystemExit(
            f"{wheels} holds no wheels: run `tools/tpu_install.py build` where pip works, carry it"
        )
    if index_url is not None and index_url.startswith("file://") and not Path(index_url[7:]).is_dir():
        raise SystemExit(f"--index-url {index_url}: no such folder here; give the machine's index or 'none'")
    stamp = target / "installed.txt"
    wanted = hashlib.sha256(
        "\n".join([*(w.name for w in found), str(index_url), *INDEX]).encode()
    ).hexdigest()
    if stamp.is_file() and stamp.read_text() == wanted:
        print(f"{target}: already installed from these {len(found)} wheels", file=sys.stderr)
        return exports(target)
    print(f"installing {len(found)} wheels from {wheels} into {target / 'carried'}", file=sys.stderr)
    _pip(
        "--no-index",
        "--no-deps",
        "--no-compile",
        "--upgrade",
        "--target",
        str(target / "carried"),
        *map(str, found),
    )
    if index_url is not None:
        print(f"installing {', '.join(INDEX)} from {index_url} into {target / 'index'}", file=sys.stderr)
        _pip(
            "--only-binary=:all:",
            "--upgrade",
            "--index-url",
            index_url,
            "--target",
            str(target / "index"),
            *INDEX,
        )
    stamp.write_text(wanted)
    return exports(target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    build_parser = commands.add_parser("build", help="here: the wheel folder (Halyard's wheels + the rest)")
    build_parser.add_argument("--wheels", type=Path, default=DEFAULT_WHEELS, help="default: .whl-tpu/")
    build_parser.add_argument("--no-download", action="store_true", help="only Halyard's own wheels")
    build_parser.add_argument("--list", action="store_true", help="only print what would be carried")
    install_parser = commands.add_parser("install", help="there: install from the folder, print the exports")
    install_parser.add_argument("--wheels", type=Path, default=DEFAULT_WHEELS, help="default: .whl-tpu/")
    install_parser.add_argument("--target", type=Path, default=DEFAULT_TARGET, help="default: /tmp/halyard")
    install_parser.add_argument(
        "--index-url",
        default=DEFAULT_INDEX,
        help=f"the machine's package index (default {DEFAULT_INDEX}; none: skip)",
    )
    args = parser.parse_args(argv)
    if args.command == "build":
        if args.list:
            print("\n".join(carried_requirements()))
            return 0
        built = build(args.wheels, download=not args.no_download)
        size = sum(path.stat().st_size for path in built) / 2**20
        print(f"{len(built)} wheels, {size:.1f} MiB in {args.wheels}", file=sys.stderr)
        return 0
    index_url = None if args.index_url.lower() == "none" else args.index_url
    print(install(args.wheels, args.target.resolve(), index_url))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
