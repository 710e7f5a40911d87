"""The image's runtime contract without Docker: the wheel the Dockerfile builds, installed into
a fresh virtualenv, started the way the image starts it (its ENTRYPOINT and ENV, from the parsed
Dockerfile), passes the image's HEALTHCHECK command, serves metrics on the bind-all host, and on
SIGTERM exits 0 after writing the final checkpoint (of a Step's state) into
TRIDENT_CHECKPOINT__DIR.

What it cannot show: the base images, the CUDA variant, the non-root user, BuildKit itself.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from conftest import random_rollout

from service.checkpoint import list_checkpoints
from service.client.client import TridentClient

from .tools import REPO, final_stage

STARTUP_TIMEOUT_S = 60.0
# A small model, so the NumPy trainer builds at once; ports 0: the OS picks free ones.
TEST_ENV = {
    "TRIDENT_MODEL__OBS_DIM": "6",
    "TRIDENT_MODEL__HIDDEN_DIM": "16",
    "TRIDENT_SERVER__PORT": "0",
    "TRIDENT_SERVER__METRICS_PORT": "0",
    "TRIDENT_SERVER__SHUTDOWN_GRACE_S": "2",
}


def without_pythonpath() -> dict[str, str]:
    """This environment less PYTHONPATH: one naming the checkout (as a worktree's runs set it)
    shows pip the checkout's trident as installed, and imports it instead of the wheel's."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def install_wheel(tmp_path: Path) -> Path:
    """The project's wheel in a fresh virtualenv; dependencies come from this Python's."""
    wheels, venv = tmp_path / "wheels", tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(wheels), str(REPO)],
        check=True, capture_output=True, timeout=300, env=without_pythonpath(),
    )  # fmt: skip
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
        check=True, capture_output=True, timeout=120, env=without_pythonpath(),
    )  # fmt: skip
    (wheel,) = wheels.glob("trident-*.whl")
    subprocess.run(
        [venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-deps", "--no-index",
         str(wheel)],
        check=True, capture_output=True, timeout=300, env=without_pythonpath(),
    )  # fmt: skip
    return venv


def serving_event(log: Path) -> dict | None:
    for line in log.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and record.get("event") == "serving":
            return record
    return None


@pytest.mark.slow
def test_installed_wheel_runs_as_the_image_runs_it(tmp_path: Path) -> None:
    stage = final_stage()
    venv = install_wheel(tmp_path)
    image_env = dict(item.split("=", 1) for args in stage["ENV"] for item in shlex.split(args))
    checkpoints = tmp_path / "checkpoints"  # stands for the image's VOLUME
    assert image_env.pop("TRIDENT_CHECKPOINT__DIR") == stage["VOLUME"][0]
    image_env.pop("PATH")  # /opt/venv/bin first: here, this test's venv
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in without_pythonpath().items() if not k.startswith("TRIDENT_")}
    env.update(image_env)
    env.update(TEST_ENV)
    env.update(
        PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        HOME=str(home),
        TRIDENT_CHECKPOINT__DIR=str(checkpoints),
    )

    # The wheel's package and kernels, not the checkout's (cwd is outside the repository).
    probe = "import service, sys; print(service.__file__); print(sys.prefix)"
    where = subprocess.run(
        [venv / "bin" / "python", "-c", probe], cwd=home, env=env,
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert Path(where[0]).is_relative_to(venv) and Path(where[1]) == venv
    assert (venv / "share" / "trident" / "kernels" / "common.cuh").is_file()

    log = tmp_path / "serve.log"
    entrypoint = json.loads(stage["ENTRYPOINT"][0])
    with log.open("w") as stderr:
        proc = subprocess.Popen(
            entrypoint, cwd=home, env=env, stdout=subprocess.DEVNULL, stderr=stderr, text=True
        )
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while (event := serving_event(log)) is None:
            assert proc.poll() is None, f"exited {proc.returncode}:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"not serving after {STARTUP_TIMEOUT_S} s"
            time.sleep(0.2)
        assert event["host"] == "0.0.0.0" and event["backend"] == "numpy"

        # The image's HEALTHCHECK command, on the port the OS picked.
        (healthcheck,) = stage["HEALTHCHECK"]
        command = json.loads(healthcheck.split(" CMD ", 1)[1])
        command[command.index("--server") + 1] = f"127.0.0.1:{event['port']}"
        health = subprocess.run(command, cwd=home, env=env, capture_output=True, text=True)
        assert health.returncode == 0 and health.stdout.strip() == "SERVING", health

        url = f"http://127.0.0.1:{event['metrics_port']}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            assert b"trident_steps_total" in response.read()
        # A Step: the drain has something new to commit.
        with TridentClient(f"127.0.0.1:{event['port']}") as client:
            assert client.step(random_rollout(np.random.default_rng(0))).global_step == 1

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    (final,) = list_checkpoints(checkpoints)  # the one committed at the drain
    assert final.name.startswith("final-")
