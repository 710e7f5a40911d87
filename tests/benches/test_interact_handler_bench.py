"""bench/interact_handler.py runs: a real engine answers every request and trains its Steps,
and the handler's own time is split by function (its size is the machine's, not checked)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from service.testing.serverproc import clean_env

ROOT = Path(__file__).resolve().parents[2]


def test_the_handler_bench_answers_every_request(tmp_path: Path) -> None:
    out = tmp_path / "handler.json"
    command = [sys.executable, str(ROOT / "bench" / "interact_handler.py"), "--rows", "64",
               "--requests", "48", "--rollout-len", "8", "--out", str(out)]  # fmt: skip
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(command, cwd=ROOT, env={**clean_env(), "PYTHONPATH": path},
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    assert report["requests"] == 48 + 2  # every request and the closing reply
    assert report["steps_trained"] == 48 // 8  # each rollout of 8 requests, trained once
    assert report["handler_ms_per_request"] > 0
    # the split by function: which functions lead is the machine's (under load a copy may
    # outrank `observe`), so only its form is checked
    top = report["top"]
    assert len(top) == 12 and all(row["calls"] >= 1 for row in top)
    assert [row["ms_per_request"] for row in top] == sorted(
        (row["ms_per_request"] for row in top), reverse=True)
