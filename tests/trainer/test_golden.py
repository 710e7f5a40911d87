"""The NumPy trainer reproduces its golden record byte for byte (tests/golden_record.py): the
parameter digest after each of 20 Steps and Act's outputs in every mode. A change that is meant
to keep what the trainer computes (a refactor) must keep this test green; one that changes the
math regenerates the record with the command in golden_record.py and says so in its commit.
The record runs in a process of its own under the pinned arithmetic (PINNED_ARITHMETIC), so
the bytes are the code's, not the processor's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from golden_record import PINNED_ARITHMETIC, arithmetic_pinnable

from service.testing.serverproc import clean_env

HERE = Path(__file__).resolve().parents[1]  # tests/: the record and its script
GOLDEN = HERE / "golden" / "trainer_numpy.json"


@pytest.mark.skipif(not arithmetic_pinnable(), reason="the record's pinned arithmetic is x86-64's")
def test_numpy_trainer_reproduces_its_golden_record() -> None:
    want = json.loads(GOLDEN.read_text())
    path = os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, str(HERE / "golden_record.py"), "--backend", "numpy"],
        env={**clean_env(), **PINNED_ARITHMETIC, "PYTHONPATH": path},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["config"] == want["config"]
    for mine, theirs in zip(got["steps"], want["steps"], strict=True):
        assert mine == theirs, f"Step {theirs['step']}: {mine['digest']} != {theirs['digest']}"
    assert got["act"] == want["act"]
    assert not any(step["skipped"] for step in want["steps"])
    assert len({step["digest"] for step in want["steps"]}) == len(want["steps"])  # all moved
