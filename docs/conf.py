"""Sphinx configuration of Trident's reference site (`make docs`; tests/project/test_docs.py
builds it).

Why Sphinx with MyST rather than MkDocs: Sphinx is kept by an active team with regular releases
(MkDocs' core has had none since 1.6.1), and `-W -n` fails the build on any warning, a broken
cross-reference among them; MyST lets the pages stay Markdown, the README's own format, so the
fence reader of tests/readme_shell.py runs the pages' commands as it runs the README's.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent

project = "Trident"
author = "Trident's authors"
extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_generated"]
myst_heading_anchors = 3
myst_enable_extensions = ["dollarmath"]
html_theme = "alabaster"
html_static_path: list[str] = []
# A page names source files as `code`, never as links: only the pages link to one another.
suppress_warnings: list[str] = []


def _write_config_reference() -> None:
    """docs/_generated/config.toml: every setting with its doc, as `trident config` prints it,
    so the configuration page is the code's own words at the tree being built."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, "-m", "service.cli", "config"], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=True)
    out = DOCS / "_generated" / "config.toml"
    out.parent.mkdir(exist_ok=True)
    if not out.exists() or out.read_text() != done.stdout:
        out.write_text(done.stdout)


_write_config_reference()
