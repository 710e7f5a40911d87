"""The README's fenced shell and Python blocks as a reader would run them, in order.

`blocks(path)` reads the ```bash and ```python fences of a Markdown file; `Block.needs` says
what outside this machine a block needs (Docker, a cluster, a GPU host), so it is left out
with that reason rather than silently; `commands` joins backslash continuations into one
command each. `Session` runs them in one working directory with one environment: a
`trident serve` command is a server a reader starts in its own shell, so it runs in the
background once its health check answers and is stopped (SIGTERM, exit 0) at the end; a
long job can be started in another shell too, and must exit 0 by the end.
"""

from __future__ import annotations

import itertools
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
SHELL_LANGUAGES = {"bash", "sh", "shell", "console"}
# What a block needs that CI has not, by the first word of one of its commands.
OUTSIDE = {"docker": "Docker", "kubectl": "a Kubernetes cluster"}
PLACEHOLDER_HOST = re.compile(r"\b[A-Z][A-Z_]*_HOST\b")  # GPU_HOST: a machine the reader names
READY_S = 120.0
SERVER_STOP_S = 30.0


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    language: str  # "shell" or "python"
    text: str

    @property
    def where(self) -> str:
        return f"{self.path.parent.name}/{self.path.name}:{self.line}"

    def commands(self) -> list[str]:
        """Each command of a shell block, continuation lines joined, comments and blanks left."""
        joined = self.text.replace("\\\n", " ")
        return [line.strip() for line in joined.splitlines() if line.strip() and not
                line.lstrip().startswith("#")]  # fmt: skip

    def needs(self) -> str | None:
        """What outside a CI machine this block needs, or None when it runs here."""
        if self.language != "shell":
            return None
        for command in self.commands():
            for word, what in OUTSIDE.items():
                if word in shlex.split(command, comments=True)[:1]:
                    return what
            if PLACEHOLDER_HOST.search(command.split("#")[0]):
                return "a GPU host the reader names"
        return None


def blocks(path: Path) -> list[Block]:
    """The shell and Python fences of a Markdown file, in order."""
    text = path.read_text()
    found = []
    for match in FENCE.finditer(text):
        language = match.group(1).lower()
        if language in SHELL_LANGUAGES or language == "python":
            kind = "python" if language == "python" else "shell"
            line = text.count("\n", 0, match.start()) + 1
            found.append(Block(path, line, kind, match.group(2)))
    return found


def serve_port(command: str) -> int | None:
    """The gRPC port of a `trident serve` command (50051 unless --port names one), else None."""
    words = shlex.split(command, comments=True)
    if words[:2] != ["trident", "serve"]:
        return None
    for flag, value in itertools.pairwise(words):
        if flag == "--port":
            return int(value)
    return 50051


@dataclass
class Background:
    """A command a reader runs in another shell: a server, or a long job."""

    command: str
    process: subprocess.Popen[str]
    log: Path


@dataclass
class Session:
    """One reader's terminal: a working directory, an environment, and the servers started."""

    cwd: Path
    env: dict[str, str]
    logs: Path
    transcript: list[str] = field(default_factory=list)
    servers: list[Background] = field(default_factory=list)
    jobs: list[Background] = field(default_factory=list)

    def run(self, command: str, timeout_s: float) -> str:
        """Run a foreground command to completion; fail with its output unless it exits 0."""
        port = serve_port(command)
        if port is not None:
            self.start_server(command, port)
            return ""
        started = time.monotonic()
        done = subprocess.run(
            ["bash", "-c", command], cwd=self.cwd, env=self.env, capture_output=True,
            text=True, timeout=timeout_s,
        )  # fmt: skip
        output = done.stdout + done.stderr
        self.transcript.append(f"$ {command}  # exit {done.returncode}, "
                               f"{time.monotonic() - started:.0f} s\n{output[-4000:]}")  # fmt: skip
        assert done.returncode == 0, f"`{command}` exited {done.returncode}:\n{output[-6000:]}"
        return done.stdout

    def run_python(self, source: str, timeout_s: float) -> None:
        script = self.logs / f"block-{len(self.transcript)}.py"
        script.write_text(source)
        self.run(f"python {shlex.quote(str(script))}", timeout_s)

    def start_server(self, command: str, port: int) -> None:
        assert not serving(port), (
            f"`{command}`: port {port} already answers health checks before it starts: another "
            "server holds the README's fixed port (another run of this test on the machine?)"
        )
        self.start(command, lambda: serving(port), f"a health answer on port {port}", server=True)

    def start(
        self, command: str, ready: Callable[[], bool], what: str, server: bool = False
    ) -> None:
        """Start `command` as a reader would in another shell; return once `ready()` holds."""
        log = self.logs / f"shell-{len(self.servers) + len(self.jobs)}.log"
        with log.open("w") as sink:
            process = subprocess.Popen(
                ["bash", "-c", f"exec {command}" if server else command], cwd=self.cwd,
                env=self.env, stdout=sink, stderr=subprocess.STDOUT, text=True,
            )  # fmt: skip
        (self.servers if server else self.jobs).append(Background(command, process, log))
        self.transcript.append(f"$ {command}  # in its own shell, {log.name}")
        deadline = time.monotonic() + READY_S
        while not ready():
            assert process.poll() is None, (
                f"`{command}` exited {process.returncode}:\n{log.read_text()[-6000:]}"
            )
            assert time.monotonic() < deadline, f"`{command}`: no {what} in {READY_S} s"
            time.sleep(0.1)

    def finish_jobs(self, timeout_s: float) -> None:
        """Wait for the commands started in other shells (servers aside) to exit 0."""
        for job in self.jobs:
            code = job.process.wait(timeout_s)
            self.transcript.append(f"$ {job.command}  # exit {code}\n"
                                   f"{job.log.read_text()[-4000:]}")  # fmt: skip
            assert code == 0, f"`{job.command}` exited {code}:\n{job.log.read_text()[-6000:]}"

    def stop(self) -> dict[str, int | None]:
        """SIGTERM every server and job still running, newest first; each one's exit code."""
        codes: dict[str, int | None] = {}
        for server in reversed(self.servers + self.jobs):
            if server.process.poll() is None:
                server.process.send_signal(signal.SIGTERM)
            try:
                codes[server.command] = server.process.wait(SERVER_STOP_S)
            except subprocess.TimeoutExpired:
                server.process.kill()
                codes[server.command] = None
        return codes


def serving(port: int) -> bool:
    """Whether 127.0.0.1:`port` answers its health check SERVING."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=1
            )
        except grpc.RpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def tracked_files(root: Path) -> Iterator[Path]:
    """What a clone of this tree holds: the files git tracks, as they are in the working tree.
    Untracked files stay out, ignored or not: what a user's own runs left in the checkout
    (obs.npy, runs/, a scratch script) is not part of the tree the README is tested on."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached"],
        cwd=root, capture_output=True, check=True,
    ).stdout  # fmt: skip
    for name in listed.decode().split("\0"):
        if name and (root / name).is_file():
            yield Path(name)
