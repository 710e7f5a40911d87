"""The CUDA trainer reproduces its golden record byte for byte (tests/golden_record.py with
--backend cuda): the parameter digest after each of 20 Steps and Act's outputs in every mode,
as tests/golden/trainer_cuda.json records them, so a change meant to keep the math keeps these
bytes. The CUDA digests differ from the NumPy ones (reduction orders differ); each backend is
compared with its own record."""

from __future__ import annotations

import json
from pathlib import Path

from golden_record import CONFIG, record

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "trainer_cuda.json"


def test_cuda_trainer_reproduces_its_golden_record() -> None:
    want = json.loads(GOLDEN.read_text())
    assert want["config"] == list(CONFIG)
    got = json.loads(json.dumps(record("cuda")))
    for mine, theirs in zip(got["steps"], want["steps"], strict=True):
        assert mine == theirs, f"Step {theirs['step']}: {mine['digest']} != {theirs['digest']}"
    assert got["act"] == want["act"]
