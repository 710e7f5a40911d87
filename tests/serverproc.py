"""A real `trident serve` process on loopback, for the server tests.

`running_server(tmp_path, *overrides)` starts `python -m service.cli serve` on ports picked by the
OS, waits for its `"event": "serving"` log line, keeps draining its stderr (so the pipe never
fills) and, on exit, sends SIGTERM and waits for it (SIGKILL after a timeout).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from service.config import Config, load_config
from service.types import Rollout

# The tests' small model (see tests/test_trainer.py for the shape conventions).
SMALL = (
    "train.backend=numpy",  # the CPU suite tests the NumPy backend, GPU or not
    "model.obs_dim=6",
    "model.hidden_dim=16",
    "replay.min_size=16",
    "replay.batch_size=8",
    "ppo.num_minibatches=2",
)
# Test-process settings that do not touch the math: a short drain, so shutdown is quick.
SERVING = ("server.shutdown_grace_s=5",)
STARTUP_TIMEOUT_S = 60.0
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
STOP_TIMEOUT_S = 30.0


def clean_env() -> dict[str, str]:
    """This process's environment without TRIDENT_* variables (they would change the config)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("TRIDENT_")}


def small_config(*overrides: str) -> Config:
    """The config an in-process Trainer needs to match a server started with `overrides`."""
    return load_config(env={}, overrides=[*SMALL, *overrides])


def trident_cli(
    *args: str, cwd: Path | None = None, timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """Run `python -m service.cli ARGS` to completion."""
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        cwd=cwd,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@dataclass(frozen=True)
class TlsFiles:
    """Server-side TLS settings: certificate and key PEM paths, and the client CA for mTLS."""

    cert: Path
    key: Path
    client_ca: Path | None = None

    def overrides(self) -> list[str]:
        settings = [f"server.tls_cert={self.cert}", f"server.tls_key={self.key}"]
        if self.client_ca is not None:
            settings.append(f"server.tls_client_ca={self.client_ca}")
        return settings


@dataclass
class ServerProcess:
    """A started server: its process, ports and every stderr line it has written so far."""

    proc: subprocess.Popen[str]
    checkpoint_dir: Path
    port: int = 0
    metrics_port: int = 0
    lines: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _serving: threading.Event = field(default_factory=threading.Event)
    _eof: threading.Event = field(default_factory=threading.Event)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        """The JSON log lines written so far (those whose "event" is `name`, if given)."""
        with self._lock:
            lines = list(self.lines)
        found = []
        for line in lines:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and (name is None or record.get("event") == name):
                found.append(record)
        return found

    def stderr(self) -> str:
        with self._lock:
            return "\n".join(self.lines)

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            line = raw.rstrip("\n")
            with self._lock:
                self.lines.append(line)
            if not self._serving.is_set() and '"serving"' in line:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if record.get("event") == "serving":
                    self.port = int(record["port"])
                    self.metrics_port = int(record["metrics_port"])
                    self._serving.set()
        self._eof.set()

    def wait_serving(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._serving.wait(0.05):
                return
            if self._eof.is_set():
                self.proc.wait(10)
                raise RuntimeError(
                    f"server exited with {self.proc.returncode} before serving:\n{self.stderr()}"
                )
        raise RuntimeError(f"server not serving after {timeout} s:\n{self.stderr()}")

    def terminate(self, timeout: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM (if still running), wait, SIGKILL after `timeout`; the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._eof.wait(10)
        return self.proc.returncode


def serve_command(
    checkpoint_dir: Path,
    overrides: Sequence[str],
    token: str | None,
    tls: TlsFiles | None,
    extra_args: Sequence[str],
) -> list[str]:
    settings = [*SMALL, *SERVING, *overrides]
    if token is not None:
        settings.append(f"server.auth_token={token}")
    if tls is not None:
        settings.extend(tls.overrides())
    command = [
        sys.executable,
        "-m",
        "service.cli",
        "serve",
        "--port",
        "0",
        "--metrics-port",
        "0",
        "--checkpoint-dir",
        str(checkpoint_dir),
    ]
    for setting in settings:
        command += ["--set", setting]
    return [*command, *extra_args]


def start_server(
    tmp_path: Path,
    *overrides: str,
    token: str | None = None,
    tls: TlsFiles | None = None,
    extra_args: Sequence[str] = (),
    checkpoint_dir: Path | None = None,
) -> ServerProcess:
    """Start a server and wait until it logs "serving"; the caller must `terminate()` it."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    checkpoint_dir = checkpoint_dir or tmp_path / "checkpoints"
    command = serve_command(checkpoint_dir, overrides, token, tls, extra_args)
    proc = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=clean_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
    )
    server = ServerProcess(proc, checkpoint_dir)
    threading.Thread(target=server._drain, name="server-stderr", daemon=True).start()
    try:
        server.wait_serving(STARTUP_TIMEOUT_S)
    except BaseException:
        server.terminate()
        raise
    return server


@contextmanager
def running_server(
    tmp_path: Path,
    *overrides: str,
    token: str | None = None,
    tls: TlsFiles | None = None,
    extra_args: Sequence[str] = (),
    checkpoint_dir: Path | None = None,
) -> Iterator[ServerProcess]:
    """A serving `trident serve` process (small model + `overrides`), stopped on exit."""
    server = start_server(
        tmp_path,
        *overrides,
        token=token,
        tls=tls,
        extra_args=extra_args,
        checkpoint_dir=checkpoint_dir,
    )
    try:
        yield server
    finally:
        server.terminate()


def random_rollout(
    rng: np.random.Generator,
    T: int = 5,
    N: int = 6,
    D: int = 6,
    A: int = 9,
    K: int = 3,
    policy_version: int | None = None,
    extras: bool = True,
) -> Rollout:
    """A random rollout with some truncated steps (and their final observations), BCE labels
    and aux targets (when `extras`)."""
    truncated = rng.random((T, N)) < 0.15
    terminated = (rng.random((T, N)) < 0.15) & ~truncated
    index = np.flatnonzero(truncated.reshape(-1))
    return Rollout(
        obs=rng.standard_normal((T + 1, N, D)).astype(np.float32),
        actions=rng.integers(0, A, (T, N)).astype(np.int32),
        rewards=rng.standard_normal((T, N)).astype(np.float32),
        terminated=terminated,
        truncated=truncated,
        behavior_log_probs=(np.log(1 / A) + 0.3 * rng.standard_normal((T, N))).astype(np.float32),
        final_obs=rng.standard_normal((index.size, D)).astype(np.float32),
        final_obs_index=index,
        bce_labels=rng.integers(0, 2, (T, N)).astype(np.uint8) if extras else None,
        aux_targets=rng.standard_normal((T, N, K)).astype(np.float32) if extras else None,
        policy_version=policy_version,
    )


def scrape(server: ServerProcess) -> Samples:
    """Every sample on the server's /metrics page, by (name, sorted labels)."""
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """One sample's value; KeyError when the series is not exposed."""
    return samples[(name, tuple(sorted(labels.items())))]
