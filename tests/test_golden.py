"""The NumPy trainer reproduces its golden record byte for byte (tests/golden_record.py): the
parameter digest after each of 20 Steps and Act's outputs in every mode. A change that is meant
to keep what the trainer computes (a refactor) must keep this test green; one that changes the
math regenerates the record with the command in golden_record.py and says so in its commit."""

from __future__ import annotations

import json
from pathlib import Path

from golden_record import record

GOLDEN = Path(__file__).with_name("golden") / "trainer_numpy.json"


def test_numpy_trainer_reproduces_its_golden_record() -> None:
    want = json.loads(GOLDEN.read_text())
    got = json.loads(json.dumps(record("numpy")))
    assert got["config"] == want["config"]
    for mine, theirs in zip(got["steps"], want["steps"], strict=True):
        assert mine == theirs, f"Step {theirs['step']}: {mine['digest']} != {theirs['digest']}"
    assert got["act"] == want["act"]
    assert not any(step["skipped"] for step in want["steps"])
    assert len({step["digest"] for step in want["steps"]}) == len(want["steps"])  # all moved
