"""Comments say why the code is as it is, not how it came to be: no comment or docstring in
service/, kernels/ or bench/ narrates a change ("previously", "no longer", "used to",
"formerly"), dates itself or points at an issue number. The story of a change belongs in its
commit message, where it stays true."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HISTORY = re.compile(
    r"\b(previously|no longer|formerly)\b"
    r"|(?<!\bis )(?<!\bare )(?<!\bbe )(?<!\bbeen )(?<!\bbeing )\bused to\b"  # not "is used to do"
    r"|\b20\d\d-\d\d-\d\d\b"
    r"|\bissue #?\d+",
    re.IGNORECASE,
)
CUDA_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
GENERATED = ("_pb2.py", "_pb2_grpc.py")


def sources() -> list[Path]:
    """The code whose comments are checked (generated protobuf modules aside)."""
    files = [
        *(ROOT / "service").rglob("*.py"),
        *(ROOT / "bench").glob("*.py"),
        *(ROOT / "kernels").glob("*.cu"),
        *(ROOT / "kernels").glob("*.cuh"),
        *(ROOT / "bench" / "kernels").glob("*.cu"),
    ]
    return sorted(path for path in files if not path.name.endswith(GENERATED))


def python_comments(text: str) -> Iterator[tuple[int, str]]:
    """(line, text) of every `#` comment and docstring."""
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            docstring = ast.get_docstring(node, clean=False)
            if docstring is not None:
                yield node.body[0].lineno, docstring


def cuda_comments(text: str) -> Iterator[tuple[int, str]]:
    """(line, text) of every `//` and `/* */` comment."""
    for found in CUDA_COMMENT.finditer(text):
        yield text.count("\n", 0, found.start()) + 1, found.group(0)


def history(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    comments = python_comments(text) if path.suffix == ".py" else cuda_comments(text)
    return [
        f"{path.relative_to(ROOT)}:{line}: {found.group(0)!r} in {comment.strip()[:120]!r}"
        for line, comment in comments
        for found in HISTORY.finditer(comment)
    ]


def test_the_checked_tree_is_found() -> None:
    names = {path.name for path in sources()}
    assert {"trainer.py", "common.cuh", "gpu_step.py"} <= names
    assert not any(name.endswith("_pb2.py") for name in names)


@pytest.mark.parametrize(
    ("comment", "flagged"),
    [
        ("# previously a tuple of names", True),
        ("# the lock is no longer held here", True),
        ("# this used to copy the buffer", True),
        ("# 2026-11-30: made the ring wrap", True),
        ("# see issue 14", True),
        ("# the key is used to seed the stream", False),
        ("# Philox counters are never reused", False),
        ("# date: %Y-%m-%d", False),
    ],
)
def test_the_markers_are_the_clear_ones(comment: str, flagged: bool) -> None:
    assert bool(HISTORY.search(comment)) is flagged


def test_no_comment_narrates_history() -> None:
    found = [hit for path in sources() for hit in history(path)]
    assert not found, "comments that tell history, not why:\n" + "\n".join(found)
