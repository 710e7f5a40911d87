"""What a light import loads: the client library stays off the trainer and the backends."""

from __future__ import annotations

import json
import subprocess
import sys


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
