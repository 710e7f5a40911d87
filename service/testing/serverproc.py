"""A real `trident serve` process on loopback: the one harness of the server tests and the benches.

`ServerProcess.start(workdir, settings)` runs `python -m service.cli serve` (each setting as a
`--set`) on ports picked by the OS, waits for its `"event": "serving"` log line and keeps reading
its stderr, so the pipe never fills; as a context manager it is stopped on exit (SIGTERM, then
SIGKILL after a timeout). Tests start it through `conftest.running_server`, which adds the tests'
small model; the benches import it (`service.testing.serverproc`) and call `ServerProcess.start`
themselves.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

STARTUP_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
PR_SET_PDEATHSIG = 1  # linux/prctl.h
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def clean_env() -> dict[str, str]:
    """This process's environment without TRIDENT_* variables (they would change the config)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("TRIDENT_")}


def die_with_parent() -> None:
    """A `preexec_fn`: the child gets SIGTERM when the thread that started it ends, even by
    SIGKILL (Linux; a no-op elsewhere), so a killed bench leaves no server behind."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


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


def serve_command(
    checkpoint_dir: Path, settings: Sequence[str], extra_args: Sequence[str] = ()
) -> list[str]:
    """`trident serve` on OS-picked ports with each of `settings` as a `--set`."""
    command = [sys.executable, "-m", "service.cli", "serve", "--port", "0", "--metrics-port", "0",
               "--checkpoint-dir", str(checkpoint_dir)]  # fmt: skip
    for setting in settings:
        command += ["--set", setting]
    return [*command, *extra_args]


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

    @classmethod
    def start(
        cls,
        workdir: Path,
        settings: Sequence[str],
        *,
        checkpoint_dir: Path | None = None,
        extra_args: Sequence[str] = (),
        startup_timeout_s: float = STARTUP_TIMEOUT_S,
        dies_with_parent: bool = False,
        env: Mapping[str, str] | None = None,
    ) -> ServerProcess:
        """Start a server in `workdir` (checkpoints in `workdir/checkpoints` unless given) and
        wait until it logs "serving"; stop it with `terminate()` or a `with` block.

        `dies_with_parent`: the server gets SIGTERM when the calling thread ends, so start it
        from a thread that outlives it (Linux's PR_SET_PDEATHSIG). `env`: variables on top of
        this process's environment less its TRIDENT_* ones."""
        workdir.mkdir(parents=True, exist_ok=True)
        checkpoint_dir = checkpoint_dir or workdir / "checkpoints"
        proc = subprocess.Popen(
            serve_command(checkpoint_dir, settings, extra_args),
            cwd=workdir,
            env={**clean_env(), **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
            preexec_fn=die_with_parent if dies_with_parent else None,
        )
        server = cls(proc, checkpoint_dir)
        threading.Thread(target=server._read_stderr, name="server-stderr", daemon=True).start()
        try:
            server._wait_serving(startup_timeout_s)
        except BaseException:
            server.terminate()
            raise
        return server

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.terminate()

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

    def metrics_text(self) -> str:
        """The /metrics page as the server serves it now."""
        with urllib.request.urlopen(self.metrics_url, timeout=10) as response:
            assert response.status == 200
            return response.read().decode()

    def terminate(self, timeout: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM (if still running), wait, SIGKILL after `timeout`; the exit status, once
        every line the server wrote has been read."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._eof.wait(10)
        return self.proc.returncode

    def _read_stderr(self) -> None:
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

    def _wait_serving(self, timeout: float) -> None:
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


def scrape(server: ServerProcess) -> Samples:
    """Every sample on the server's /metrics page, by (name, sorted labels)."""
    samples: Samples = {}
    for family in text_string_to_metric_families(server.metrics_text()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """One sample's value; KeyError when the series is not exposed."""
    return samples[(name, tuple(sorted(labels.items())))]
