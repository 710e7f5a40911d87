"""The docs site builds with every warning an error, as `make docs` builds it; each bench script
has a page with its latest result; the README stays the two-screen front door."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

from readme_shell import blocks

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README_MAX_LINES = 250
# A result says how to make it again: these four fields, on a page's list, each.
RESULT_FIELDS = ("**Command**", "**Machine**", "**Tree**", "**Date**")


def make_docs(source: Path, out: Path) -> subprocess.CompletedProcess[str]:
    """The Makefile's `docs` recipe, run as written with `source` for docs/ and DOCS_OUT=`out`
    (what `make docs` runs, without needing make)."""
    makefile = (ROOT / "Makefile").read_text()
    (recipe,) = re.findall(r"^docs:\n\t(.+)$", makefile, re.M)
    words = shlex.split(recipe.replace("$(DOCS_OUT)", str(out)))
    assert words[:2] == ["python3", "-m"] and {"-W", "-n"} <= set(words), recipe
    words[words.index("docs")] = str(source)
    return subprocess.run(words, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_make_docs_builds_the_site_with_warnings_as_errors(tmp_path: Path) -> None:
    out = tmp_path / "html"
    done = make_docs(DOCS, out)
    assert done.returncode == 0, done.stdout + done.stderr
    pages = {path.relative_to(DOCS).with_suffix("") for path in DOCS.rglob("*.md")
             if "_build" not in path.parts}  # fmt: skip
    built = {path.relative_to(out).with_suffix("") for path in out.rglob("*.html")}
    assert pages <= built, pages - built


def test_the_build_fails_on_a_broken_link(tmp_path: Path) -> None:
    """-W -n: a page that links to a page that is not there stops the build."""
    site = tmp_path / "docs"
    shutil.copytree(DOCS, site, ignore=shutil.ignore_patterns("_build", "_generated"))
    for included in ("service", "deploy"):  # what the pages include, and conf.py runs
        (tmp_path / included).symlink_to(ROOT / included)
    (site / "step.md").write_text((site / "step.md").read_text() + "\n[gone](no_such_page.md)\n")
    done = make_docs(site, tmp_path / "html")
    assert done.returncode != 0 and "no_such_page" in done.stderr, done.stderr


def bench_scripts() -> list[str]:
    """bench/*.py that run on their own (a `__main__` block), as opposed to shared helpers."""
    return sorted(path.stem for path in (ROOT / "bench").glob("*.py")
                  if "__main__" in path.read_text())  # fmt: skip


def test_each_bench_script_has_a_page_with_its_latest_result() -> None:
    scripts = bench_scripts()
    assert len(scripts) >= 15, scripts
    index = (DOCS / "benchmarks" / "index.md").read_text()
    for script in scripts:
        page = DOCS / "benchmarks" / f"{script}.md"
        assert page.is_file(), f"bench/{script}.py has no page docs/benchmarks/{script}.md"
        text = page.read_text()
        assert text.startswith(f"# `{script}.py`"), f"{page.name} does not name its script"
        assert re.search(rf"^{script}$", index, re.M), f"{page.name} is not in the index"
        assert "## What it measures" in text, page.name
        assert all(field in text for field in RESULT_FIELDS), f"{page.name} lacks a field"


def test_the_readme_is_a_front_door_that_links_into_the_docs() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    linked = set(re.findall(r"\]\((docs/[\w/]+\.md)", text))
    assert {"docs/architecture.md", "docs/service.md", "docs/operations.md", "docs/step.md",
            "docs/lobsim.md", "docs/configuration.md", "docs/benchmarks/index.md"} <= linked
    assert all((ROOT / link).is_file() for link in linked), linked


def test_the_pages_commands_are_the_readmes_which_run_in_ci() -> None:
    """A reference page names commands inline and leaves runnable blocks to the README's tour,
    which tests/project/test_readme.py runs; the benchmark pages' blocks are the scripts' own,
    long."""
    pages = sorted(DOCS.glob("*.md"))
    assert len(pages) >= 8, pages
    runnable = {page.name: len(blocks(page)) for page in pages if blocks(page)}
    assert not runnable, f"docs pages with shell or Python blocks no test runs: {runnable}"
