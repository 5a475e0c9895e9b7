"""The documentation runs: every guide in docs/guides/ executes at smoke size, and the site builds
without a single warning (`mkdocs build --strict`) with the figures those runs produced."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from run_wide import run_root

REPO = Path(__file__).resolve().parents[1]
GUIDES = sorted((REPO / "docs" / "guides").glob("[0-9][0-9]_*.py"))


@pytest.fixture(scope="module")
def docs_work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder for all guides: runs and the stdlib token cache are shared between them, as for a reader;
    one for the whole pytest run, whichever test worker runs a guide (a cache's build lock lets one build it)."""
    work = run_root(tmp_path_factory) / "docs"
    work.mkdir(exist_ok=True)
    return work


def _guide_env(work: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        HALYARD_DOCS_SMOKE="1",
        HALYARD_DOCS_WORK=str(work / "runs"),
        HALYARD_DOCS_FIGURES=str(work / "figures"),
        MPLBACKEND="Agg",
        # The guides start the `train` / `halyard` commands in subprocesses; they find the same Python.
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
    )
    env.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    env.setdefault("JAX_PLATFORMS", "cpu")
    return env


def test_every_guide_is_in_the_navigation() -> None:
    navigation = (REPO / "mkdocs.yml").read_text()
    missing = [guide.name for guide in GUIDES if f"guides/{guide.stem}.md" not in navigation]
    assert not missing, f"add these guides to the nav of mkdocs.yml: {missing}"
    assert len(GUIDES) >= 6


@pytest.mark.slow
@pytest.mark.parametrize("guide", GUIDES, ids=[guide.stem for guide in GUIDES])
def test_guide_runs(guide: Path, docs_work: Path) -> None:
    completed = subprocess.run(
        [sys.executable, str(guide)],
        cwd=docs_work,
        env=_guide_env(docs_work),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, (
        f"{guide.name} failed (exit {completed.returncode}):\n{completed.stdout[-4000:]}\n{completed.stderr[-6000:]}"
    )


@pytest.mark.slow
def test_site_builds_strict(docs_work: Path, tmp_path: Path) -> None:
    env = _guide_env(docs_work)
    if not any((docs_work / "figures").glob("*.png")):
        env.pop("HALYARD_DOCS_FIGURES")  # run alone: the committed figures stand in
    completed = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        env=dict(env, NO_MKDOCS_2_WARNING="1"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, f"mkdocs build --strict failed:\n{completed.stderr[-6000:]}"
    site = tmp_path / "site"
    for guide in GUIDES:
        page = (site / "guides" / guide.stem / "index.html").read_text()
        code_cells = guide.read_text().count("\n# %%\n")
        assert page.count('class="highlight"') >= code_cells, (
            f"{guide.stem}: code cells missing from the page"
        )
    assert "trainer.steps" in (site / "concepts" / "config" / "index.html").read_text()
    for png in (REPO / "docs" / "guides" / "figures").glob("*.png"):
        assert (site / "guides" / "figures" / png.name).exists()


def test_script_cells_render_to_markdown() -> None:
    sys.path.insert(0, str(REPO / "docs" / "_hooks"))
    try:
        from halyard_docs import script_to_markdown
    finally:
        sys.path.pop(0)
    page = script_to_markdown(
        "# %% [markdown]\n# # Title\n#\n# Some *text*.\n\n# %%\nx = 1\n\n# %%\n", "g.py"
    )
    assert page.startswith("# Title\n")
    assert "Some *text*." in page
    assert "```python\nx = 1\n```" in page
    assert "[`g.py`](g.py)" in page


def test_config_reference_lists_every_key() -> None:
    from halyard.train.config.flatten import flatten_config
    from halyard.train.run_config import TrainConfig

    sys.path.insert(0, str(REPO / "docs" / "_hooks"))
    try:
        from halyard_docs import config_reference
    finally:
        sys.path.pop(0)
    page = config_reference()
    for key in flatten_config(TrainConfig()):
        shown = f"`{key}: " if key.endswith(".type") else f"`{key}`"
        assert shown in page, f"the config reference misses {key}"
    for family in ("gpt2", "llama", "mistral", "mixtral", "mup", "qwen2"):
        assert f"`model.type: {family}`" in page
