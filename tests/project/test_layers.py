"""Layers the import contract cannot see: what a light import loads (the client library stays
off the trainer and the backends), and the trainer's ignorance of the device."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

TRAINER = Path(__file__).resolve().parents[2] / "service" / "trainer"
# Device plumbing the backend's executor owns, as code spells it: CuPy, CUDA calls, tests of
# which backend runs, streams, events and graph capture.
DEVICE_PLUMBING = re.compile(
    r"\bcupy\b|\.cuda\b|\bis\s+(not\s+)?np\b|\bstreams?\b|Stream\(|wait_event|\.record\("
    r"|begin_capture|\.graphs\b"
)


def loaded_after(statement: str) -> list[str]:
    """The `service.*` modules a fresh interpreter holds after running `statement`."""
    listing = "sorted(m for m in sys.modules if m.startswith('service'))"
    code = f"import json, sys; {statement}; print(json.dumps({listing}))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def test_the_client_loads_neither_the_trainer_nor_a_backend() -> None:
    loaded = loaded_after("import service.client.client")
    assert "service.client.client" in loaded and "service.types" in loaded
    heavy = [m for m in loaded if m.startswith(("service.trainer", "service.backend"))]
    assert not heavy, heavy


def test_the_trainer_leaves_the_device_to_the_executor() -> None:
    caught = ["import cupy", "xp.cuda.Stream(non_blocking=True)", "if xp is np:", "xp is not np",
              "a.set(stream=s)", "side.wait_event(e)", "self.graphs.run(key, fn)"]  # fmt: skip
    assert all(DEVICE_PLUMBING.search(line) for line in caught)
    sources = sorted(TRAINER.rglob("*.py"))
    assert len(sources) > 5, TRAINER
    found = [
        f"{path.relative_to(TRAINER.parent)}:{number}: {line.strip()}"
        for path in sources
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if DEVICE_PLUMBING.search(line)
    ]
    assert not found, "\n".join(found)
