"""The learner process's front ends (server.front_ends >= 1): N `service.server.front_end`
processes on the one public port, started, watched and replaced.

The learner reserves the public port first (a socket bound with SO_REUSEPORT that never
listens, as grpc's examples/python/multiprocessing does), so port 0 picks one port for all and
a port held by another program is an error before anything starts. Each front end binds it
with `grpc.so_reuseport` and the kernel spreads connections over them.

A front end that exits while the server runs is replaced: logged ("front end died"), counted
in trident_front_end_restarts_total. One that exits before it ever served (a bind or TLS
error), or more than MAX_RESTARTS deaths within RESTART_WINDOW_S, stops the server, saying why:
a front end that cannot stay up would otherwise be restarted for ever.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from errno import EADDRINUSE
from typing import Any

from service import logs
from service.config import ConfigError

# server.front_ends = -1: on a host with at least AUTO_MIN_CORES cores available to the server,
# AUTO_CORE_SHARE of them as front ends; none on a smaller one (one process serves a small host
# as fast). Many front ends, as the kernel hashes each connection to one of them: with few, one
# often holds twice its share of streams, and every stream waits at the Step queue for its
# slower ones (docs/benchmarks/served.md).
AUTO_CORE_SHARE = 0.75
AUTO_MIN_CORES = 8
RESTART_WINDOW_S = 60.0
MAX_RESTARTS = 5  # deaths within RESTART_WINDOW_S past which the server stops
WATCH_S = 0.1  # how often the processes are looked at
KILL_AFTER_S = 5.0  # past the grace, a front end still running is killed
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound to host:port with SO_REUSEPORT and not listening: the front ends' port,
    held for them (port 0: one the OS picks). ConfigError naming the settings when the port
    is taken, also by another server's front ends (SO_REUSEPORT would share it with them: a
    connection there is answered, where this socket answers none)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]  # fmt: skip
        sock = socket.socket(family, kind, proto)
    except OSError as error:
        raise ConfigError(f"server.host = {host!r} (--host): {error}; expected an address "
                          "of this host") from None  # fmt: skip
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
        if port and _answered(family, address):
            raise OSError(EADDRINUSE, os.strerror(EADDRINUSE))
    except OSError as error:
        sock.close()
        raise ConfigError(
            f"server.host:server.port = {host}:{port} (--host, --port): "
            f"{error.strerror or error}; expected a free address to bind (stop what holds the "
            "port, or pick another --port; 0 picks a free one)"
        ) from None
    return sock


def _answered(family: socket.AddressFamily, address: tuple[Any, ...]) -> bool:
    """Whether something listens at `address` (a wildcard address: at loopback)."""
    host = address[0]
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1" if family == socket.AF_INET else "::1"
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        return probe.connect_ex((host, *address[1:])) == 0


def _die_with_parent() -> None:
    """A `preexec_fn`: SIGTERM to the child when the thread that started it ends (the
    learner's watcher thread, which outlives every front end it starts), SIGKILL included."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)



def front_end_count(setting: int, fit: int, cores: int | None = None) -> int:
    """How many front-end processes server.front_ends = `setting` asks for on a host with
    `cores` cores available to this process (None: this one's), where the shared memory of at
    most `fit` front ends' slots is allowed (server.handoff_max_mb): the default takes no
    more."""
    if setting >= 0:
        return setting
    if cores is None:
        cores = len(os.sched_getaffinity(0))
    return min(int(cores * AUTO_CORE_SHARE), fit) if cores >= AUTO_MIN_CORES else 0

class FrontEnds:
    """`count` front-end processes, each started by `command(index)` with `settings` on its
    stdin (they hold the token: never on disk); `restarted()` counts a replacement,
    `failed(why)` asks the server to stop."""

    def __init__(
        self,
        count: int,
        command: Callable[[int], list[str]],
        settings: bytes,
        restarted: Callable[[], None],
        failed: Callable[[str], None],
    ) -> None:
        self.count, self._command, self._settings = count, command, settings
        self._restarted, self._failed = restarted, failed
        self._procs: list[subprocess.Popen[bytes] | None] = [None] * count
        self._served = [False] * count  # whether the process in this place has said `ready`
        self._deaths: deque[float] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._why = "front ends stopped"
        self._thread = threading.Thread(target=self._watch, name="trident-front-ends",
                                         daemon=True)  # fmt: skip

    def start(self, timeout_s: float) -> list[int]:
        """Start them all and wait until each serves; their pids. ConfigError saying why when
        one exits first (its own line says what it could not do) or `timeout_s` passes."""
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not all(self._served):
                if self._stopping:
                    raise ConfigError(f"server.front_ends = {self.count}: {self._why}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ConfigError(f"server.front_ends = {self.count}: not every front end "
                                      f"served within {timeout_s:g} s")  # fmt: skip
                self._cond.wait(left)
            return [proc.pid for proc in self._procs if proc is not None]

    def ready(self, pid: int, index: int) -> None:
        """Front end `index` (process `pid`) serves (its `ready` call)."""
        with self._cond:
            proc = self._procs[index] if 0 <= index < self.count else None
            if proc is not None and proc.pid == pid:
                self._served[index] = True
                self._cond.notify_all()
        logs.event(logging.INFO, "front end serving", index=index, pid=pid)

    def pids(self) -> list[int]:
        with self._cond:
            return [proc.pid for proc in self._procs if proc is not None]

    def terminate(self) -> None:
        """SIGTERM each (each drains: new calls refused, calls in flight finished)."""
        with self._cond:
            self._stopping = True
            procs = [proc for proc in self._procs if proc is not None]
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)

    def wait(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for them to exit, then kill the rest; the watcher ends."""
        deadline = time.monotonic() + timeout_s
        for proc in [proc for proc in self._procs if proc is not None]:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logs.event(logging.WARNING, "front end still running after the grace; killed",
                           pid=proc.pid)  # fmt: skip
                proc.kill()
                proc.wait()
        if self._thread.is_alive():
            self._thread.join()

    # ------------------------------------------------------------------------ watching
    def _spawn(self, index: int) -> None:
        proc = subprocess.Popen(self._command(index), stdin=subprocess.PIPE,
                                preexec_fn=_die_with_parent)  # fmt: skip
        assert proc.stdin is not None
        with contextlib.suppress(BrokenPipeError), proc.stdin:  # one that died at once: _died
            proc.stdin.write(self._settings)
        with self._cond:
            self._procs[index], self._served[index] = proc, False

    def _watch(self) -> None:
        """Start each, then replace each that exits until `terminate`; its own thread, so that
        the children's PR_SET_PDEATHSIG ties them to it."""
        for index in range(self.count):
            self._spawn(index)
        while True:
            with self._cond:
                if self._stopping:
                    break
                dead = [(i, proc) for i, proc in enumerate(self._procs)
                        if proc is not None and proc.poll() is not None]  # fmt: skip
            for index, proc in dead:
                self._died(index, proc)
            time.sleep(WATCH_S)
        # held until the children exit: they die with this thread
        for child in list(self._procs):
            if child is not None:
                child.wait()

    def _died(self, index: int, proc: subprocess.Popen[bytes]) -> None:
        now = time.monotonic()
        self._deaths.append(now)
        while self._deaths and now - self._deaths[0] > RESTART_WINDOW_S:
            self._deaths.popleft()
        served = self._served[index]
        logs.event(logging.WARNING, "front end died", index=index, pid=proc.pid,
                   exit_code=proc.returncode, had_served=served)  # fmt: skip
        if not served:
            self._stop(f"front end {index} (pid {proc.pid}) exited with {proc.returncode} before "
                       "it served: see its log lines above")  # fmt: skip
        elif len(self._deaths) > MAX_RESTARTS:
            self._stop(f"{len(self._deaths)} front-end deaths within {RESTART_WINDOW_S:g} s "
                       f"(more than {MAX_RESTARTS}): the front ends cannot stay up")  # fmt: skip
        else:
            self._spawn(index)
            self._restarted()

    def _stop(self, why: str) -> None:
        with self._cond:
            self._stopping, self._why = True, why
            self._cond.notify_all()
        self._failed(why)


def private_dir() -> str:
    """A folder only this user reads (0700), for the handoff's socket."""
    path = tempfile.mkdtemp(prefix="trident-front-ends-")
    os.chmod(path, 0o700)
    return path
