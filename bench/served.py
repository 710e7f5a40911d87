"""The served path end to end: one real `trident serve` trained by K real actor processes.

    python bench/served.py                      # lobsim cartpole loadgen, K = 1 3 6 12, 3 runs
    python bench/served.py --loads loadgen --actors 1 6 --set train.backend=cuda

Per cell (load, K) the script starts a server (127.0.0.1, ports picked by the OS; the shape the
load needs, the server's defaults otherwise: what a user gets; `--set` makes a tuned row), then
K processes of the load:

- `lobsim`: `trident actor --env lobsim` (N LobSim markets each, on its Interact stream);
- `cartpole`: `trident actor --env gymnasium:CartPole-v1`;
- `loadgen`: this script's hidden worker mode (`--worker loadgen`): no environment, random
  observations of LobSim's shape and its label shapes, so the server is measured with almost
  nothing else on the cores. `--protocol` names its calls: `interact` (the default), `act-step`,
  the unary path (T Acts, then one keyed Step of the [T, N] rollout), or `step`, keyed Steps
  alone (random actions, each sent once the last is answered).

Each process runs `--duration` seconds from its own start (the line it prints once connected).
The window opens `--warmup` s after the last process started (and not before the server's first
Step has ended) and closes `--duration` s after the first one started. Env steps trained per
second: the samples of the Steps that ended in the window after its first, over the time from
the first to the last (the server's `step` log lines; a Step trains whole rollouts of several
actors at once, so a counter's change over the window would move by whole Steps with where its
edges fall); at least 3 Steps, else the cell says to lengthen --duration. Over the window too:
the server's Act forward histogram, the rollouts it was handed and dropped (and over the whole
cell, once its processes ended), the CPU time of the server (its process tree), of each load
process (/proc/PID/stat) and of the whole machine (what none of them used is `other_cores`:
another job on the machine), and `nvidia-smi`'s GPU utilisation every 0.5 s. Act latency:
loadgen workers record every call, so their p50 / p99 are pooled over the window; an actor
prints its own over its whole run (`done:` line: from a group's observations sent to its actions
received), so the cell shows the median of the actors' p50s and the largest p99. Writes JSON
(command, date, machine, versions, settings, every cell) to --out and prints one table.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from service.actor import HEADER
from service.client.client import TridentClient
from service.config import LobsimConfig
from service.lobsim.env import LABEL_DIM, NUM_ACTIONS, observation_dim
from service.step_ledger import StepKey
from service.testing import host_report
from service.testing.serverproc import Samples, ServerProcess, clean_env, die_with_parent, scrape
from service.types import ActMode, ActResult
from service.vector_env import EnvStep, collect_rollout

SCRIPT = Path(__file__).resolve()
PACKAGES = ("numpy", "grpcio", "protobuf", "gymnasium", "trident")
SERVER_START_S = 300.0  # a cuda server compiles its kernels first
PROCESS_START_S = 120.0  # K processes importing NumPy, gRPC (and Gymnasium) on a few cores
# Each process runs this much past --duration, so the window (which closes --duration s after
# the first one started, as the parent saw it) closes while every process still runs.
LINGER_S = 1.0
EXIT_WAIT_S = 120.0  # after the planned end: a last Step queued behind K-1 others
STOP_TIMEOUT_S = 30.0  # SIGTERM, then SIGKILL
POLL_S = 0.05
GPU_SAMPLE_S = 0.5
MIN_WINDOW_S = 1.0
MIN_STEPS = 3  # Steps ending in a window, for its rate (step_aligned_rate)
OTHER_CORES_WARN = 0.1  # CPU used by processes outside the cell: its figures are contended
TAIL_CHARS = 2000
PROFILE_WAIT_S = 30.0  # py-spy writes its file after the window
CALL_TIMEOUT_S = 60.0
LOBSIM_OBS_DIM = observation_dim(LobsimConfig())
ACTOR_READY = HEADER  # the actor's first line
WORKER_READY = "served worker: ready"
DONE_COUNTS = re.compile(r"^done: (\d+) rollouts \((\d+) trained in \d+ Steps, (\d+) dropped "
                         r"behind the policy lag, (\d+) dropped ahead")
DONE_LATENCY = re.compile(r"\b(Act|Step) p50 ([\d.]+) ms p99 ([\d.]+) ms")


@dataclass(frozen=True)
class Load:
    """What drives the server in a cell: the actor's env (None: the loadgen worker) and the
    model shape the server needs for it."""

    name: str
    env: str | None
    shape: tuple[str, ...]
    default_num_envs: int


LOBSIM_SHAPE = (
    f"model.obs_dim={LOBSIM_OBS_DIM}",
    f"model.num_actions={NUM_ACTIONS}",
    f"model.aux_dim={LABEL_DIM}",
)
LOADS = {
    "lobsim": Load("lobsim", "lobsim", LOBSIM_SHAPE, 1024),
    "cartpole": Load(
        "cartpole",
        "gymnasium:CartPole-v1",
        ("model.obs_dim=4", "model.num_actions=2", "model.aux_dim=0"),
        512,
    ),
    "loadgen": Load("loadgen", None, LOBSIM_SHAPE, 1024),
}


# ------------------------------------------------------------------------------- worker
# The loadgen worker's env shapes: observation width, and the aux targets' (None: no labels)
WORKER_SHAPES: dict[str, tuple[int, int | None]] = {
    "lobsim": (LOBSIM_OBS_DIM, LABEL_DIM),
    "cartpole": (4, None),
}

class NoEnv:
    """An env's shapes without its dynamics: random observations and rewards, no episode ends,
    and labels where `aux_dim` is given (LobSim's shapes by default), so a Step is as big as the
    env's while the env costs next to nothing; with `step_s`, each step takes that long in wall
    time (an env's pace without its CPU: the server's latency under a paced load)."""

    def __init__(
        self, num_envs: int, obs_dim: int, aux_dim: int | None, seed: int, step_s: float = 0.0
    ) -> None:
        self.num_envs, self.obs_dim, self.aux_dim = num_envs, obs_dim, aux_dim
        self.step_s = step_s
        self.rng = np.random.default_rng(seed)
        self.obs = self._observe()

    def _observe(self) -> np.ndarray:
        return self.rng.standard_normal((self.num_envs, self.obs_dim), dtype=np.float32)

    def step(self, actions: np.ndarray) -> EnvStep:
        if self.step_s:
            time.sleep(self.step_s)
        n = self.num_envs
        self.obs = self._observe()
        return EnvStep(
            obs=self.obs,
            rewards=self.rng.standard_normal(n, dtype=np.float32),
            terminated=np.zeros(n, bool),
            truncated=np.zeros(n, bool),
            final_obs=np.zeros((0, self.obs_dim), np.float32),
            bce_labels=None if self.aux_dim is None else self.rng.integers(0, 2, n, np.uint8),
            aux_targets=None if self.aux_dim is None else self.rng.standard_normal(
                (n, self.aux_dim), dtype=np.float32),
        )  # fmt: skip


@dataclass
class Record:
    """What a worker measured: each Act's end time (time.monotonic, one clock for every process
    of the machine, so the parent can keep its window's calls) and wall time, and its counts."""

    protocol: str
    actor_id: str
    started: float | None = None
    act_end: list[float] = field(default_factory=list)
    act_s: list[float] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)
    steps: int = 0
    applied: int = 0
    stale: int = 0
    error: str | None = None

    def ready(self) -> float:
        """Connected: the duration starts now (returned), and the parent learns it from the
        line printed."""
        self.started = time.monotonic()
        print(f"{WORKER_READY} id={self.actor_id} protocol={self.protocol}", flush=True)
        return self.started


def act_step(args: argparse.Namespace, record: Record) -> None:
    """The unary path: T Acts, then one keyed Step of the [T, N] rollout they built."""
    unary(args, record, acting=True)


def step_only(args: argparse.Namespace, record: Record) -> None:
    """A unary client that does not act (a learner-side client, a replay of logged data): keyed
    Steps of rollouts with uniform random actions, each sent once the last is answered, at the
    version that answer names."""
    unary(args, record, acting=False)


def unary(args: argparse.Namespace, record: Record, acting: bool) -> None:
    """Keyed Steps one after another, their rollouts acted on by the server (`acting`: T Acts
    each) or at random; a Step refused as too stale is counted and not sent again, as `trident
    actor` drops it."""
    env = NoEnv(args.num_envs, *WORKER_SHAPES[args.shape], args.seed, args.env_ms / 1e3)
    rng = np.random.default_rng(args.seed)
    with TridentClient(args.server, timeout_s=CALL_TIMEOUT_S) as client:
        status = client.status()
        actions = json.loads(status.config_json)["model"]["num_actions"]
        version = status.global_step
        started = record.ready()

        def act(obs: np.ndarray) -> ActResult:
            called = time.monotonic()
            result = client.act(obs, ActMode.SAMPLE)
            ended = time.monotonic()
            record.act_end.append(ended)
            record.act_s.append(ended - called)
            return result

        def at_random(obs: np.ndarray) -> ActResult:
            n = obs.shape[0]
            return ActResult(rng.integers(0, actions, n, dtype=np.int32),
                             np.full(n, -np.log(actions), np.float32), np.zeros(n, np.float32),
                             version)  # fmt: skip

        sequence = 0
        while time.monotonic() - started < args.duration:
            rollout = collect_rollout(act if acting else at_random, env, args.rollout_len)
            called = time.monotonic()
            try:
                reply = client.step(rollout, key=StepKey(record.actor_id, sequence))
            except grpc.RpcError as error:
                if error.code() != grpc.StatusCode.FAILED_PRECONDITION:
                    raise
                record.stale += 1
            else:
                record.steps += 1
                record.applied += bool(reply.updates_applied)
                version = reply.global_step
            record.step_s.append(time.monotonic() - called)
            sequence += 1


def interact(args: argparse.Namespace, record: Record) -> None:
    """The streaming path `trident actor` takes: the envs in --env-groups groups on one
    Interact stream (with two, one group's next observations sent while the other's actions
    are in flight); the server assembles the rollouts. An Act here is one group's
    request-to-actions time."""
    G = args.env_groups
    sizes = [args.num_envs // G + (g < args.num_envs % G) for g in range(G)]
    envs = [NoEnv(n, *WORKER_SHAPES[args.shape], args.seed + g, args.env_ms / 1e3)
            for g, n in enumerate(sizes)]  # fmt: skip
    with TridentClient(args.server, timeout_s=CALL_TIMEOUT_S) as client:
        client.status()
        started = record.ready()
        stream = client.interact(record.actor_id, 0, args.rollout_len, sizes)
        sent_at = [0.0] * len(sizes)

        def take(outcomes: list) -> None:
            for outcome in outcomes:
                if outcome.reply is not None:
                    record.steps += 1
                    record.applied += bool(outcome.reply.updates_applied)
                elif outcome.code == grpc.StatusCode.FAILED_PRECONDITION:
                    record.stale += 1
                else:
                    raise RuntimeError(f"rollout {outcome.sequence}: {outcome.message}")

        for group, env in enumerate(envs):
            sent_at[group] = time.monotonic()
            stream.send(group, env.obs, None)
        while time.monotonic() - started < args.duration:
            reply = stream.receive()
            if reply is None:
                raise RuntimeError("the server closed the stream")
            ended = time.monotonic()
            record.act_end.append(ended)
            record.act_s.append(ended - sent_at[reply.group])
            take(reply.outcomes)
            moved = envs[reply.group].step(reply.actions)
            sent_at[reply.group] = time.monotonic()
            stream.send(reply.group, moved.obs, moved)
        stream.close()
        while (reply := stream.receive()) is not None:
            take(reply.outcomes)


PROTOCOLS: dict[str, Callable[[argparse.Namespace, Record], None]] = {
    "act-step": act_step,
    "interact": interact,
    "step": step_only,
}


def run_worker(args: argparse.Namespace) -> int:
    """One loadgen process: run its protocol for --duration s, write the record even when
    stopped by SIGTERM or an error (then exit 1 with the error on stderr)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    record = Record(args.protocol, args.actor_id)
    code = 0
    try:
        PROTOCOLS[args.protocol](args, record)
    except Exception as error:
        record.error = f"{type(error).__name__}: {error}"
        print(f"served worker: {record.error}", file=sys.stderr, flush=True)
        code = 1
    finally:
        args.record.write_text(json.dumps(vars(record)) + "\n")
    return code


def parse_worker_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="bench/served.py's loadgen worker (internal)")
    parser.add_argument("--worker", choices=("loadgen",), required=True)
    parser.add_argument("--protocol", choices=sorted(PROTOCOLS), default="interact")
    parser.add_argument("--env-groups", type=int, default=1)
    parser.add_argument("--env-ms", type=float, default=0.0)
    parser.add_argument("--shape", choices=sorted(WORKER_SHAPES), default="lobsim")
    parser.add_argument("--server", required=True, help="HOST:PORT")
    parser.add_argument("--num-envs", type=int, required=True)
    parser.add_argument("--rollout-len", type=int, required=True)
    parser.add_argument("--duration", type=float, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--actor-id", required=True)
    parser.add_argument("--record", type=Path, required=True, help="JSON written at exit")
    return parser.parse_args(argv)


# ------------------------------------------------------------------------------- processes
def child_env() -> dict[str, str]:
    """Without TRIDENT_* variables, with this checkout first on the path (installed or not)."""
    env = clean_env()
    root = str(host_report.REPO_ROOT)
    env["PYTHONPATH"] = f"{root}:{env['PYTHONPATH']}" if env.get("PYTHONPATH") else root
    return env


@dataclass
class LoadProcess:
    """One of a cell's K processes, its log files, and when it started and ended."""

    index: int
    popen: subprocess.Popen[str]
    out: Path
    err: Path
    record: Path | None
    ready_prefix: str
    ready_at: float | None = None
    exited_at: float | None = None
    start_line: str | None = None  # how it runs: an actor's env, groups, rollout and id

    def watch(self) -> None:
        """Note the start line and the exit when they first show."""
        if self.ready_at is None:
            for line in self.out.read_text().splitlines():
                if line.startswith(self.ready_prefix):
                    self.ready_at, self.start_line = time.monotonic(), line
                    break
        if self.exited_at is None and self.popen.poll() is not None:
            self.exited_at = time.monotonic()

    @property
    def settled(self) -> bool:
        return self.ready_at is not None or self.exited_at is not None


def load_command(
    load: Load, index: int, target: str, num_envs: int, args: argparse.Namespace, workdir: Path
) -> tuple[list[str], Path | None]:
    """The command of process `index` of a cell, and the worker's record path (None: an actor)."""
    common = ["--num-envs", str(num_envs), "--rollout-len", str(args.rollout_len),
              "--duration", f"{args.duration + LINGER_S:g}", "--seed", str(index)]  # fmt: skip
    if load.env is None:
        record = workdir / f"worker{index}.json"
        return [
            sys.executable, str(SCRIPT), "--worker", "loadgen", "--protocol", args.protocol,
            "--env-groups", str(args.env_groups), "--env-ms", f"{args.env_ms:g}",
            "--server", target,
            "--actor-id", f"loadgen-{index}", "--record", str(record),
            *common,
        ], record  # fmt: skip
    return [
        sys.executable, "-m", "service.cli", "actor", "--server", target, "--env", load.env,
        "--steps", str(2**62), "--log-every", str(2**62), *common, *args.actor_arg,
    ], None  # fmt: skip


def spawn(command: list[str], index: int, record: Path | None, workdir: Path) -> LoadProcess:
    """Start `command` with its output in files; it gets SIGTERM if this bench dies."""
    out, err = workdir / f"proc{index}.out", workdir / f"proc{index}.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        popen = subprocess.Popen(
            command,
            cwd=workdir,
            env=child_env(),
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            text=True,
            preexec_fn=die_with_parent,
        )
    ready = WORKER_READY if record is not None else ACTOR_READY
    return LoadProcess(index, popen, out, err, record, ready)


def stop(popen: subprocess.Popen[str]) -> None:
    """SIGTERM if still running, SIGKILL after STOP_TIMEOUT_S."""
    if popen.poll() is None:
        popen.send_signal(signal.SIGTERM)
        try:
            popen.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait(10)


def tail(path: Path) -> str:
    """The end of a log file: enough to say why a process stopped, small enough for the JSON."""
    with contextlib.suppress(OSError):
        return path.read_text(errors="replace")[-TAIL_CHARS:]
    return ""


# ------------------------------------------------------------------------------- measuring
def process_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system, every thread) of a running process; None once it is gone."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return None


def tree_cpu_s(pid: int) -> float | None:
    """CPU seconds of a process and its running descendants (a server's rank processes)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(stat.parent.name))
    total, todo = process_cpu_s(pid), list(children.get(pid, []))
    if total is None:
        return None
    while todo:
        child = todo.pop()
        total += process_cpu_s(child) or 0.0
        todo.extend(children.get(child, []))
    return total


@dataclass(frozen=True)
class Snapshot:
    """Counters at one edge of the window."""

    at: float
    wall: float  # time.time(), the clock of the server's log lines
    samples: Samples | None
    server_cpu_s: float | None
    learner_cpu_s: float | None  # the server's own process (with server.front_ends: the learner)
    process_cpu_s: list[float | None]
    machine_busy_s: float | None
    own_cpu_s: float  # this script and its waited-for children (nvidia-smi)

    @classmethod
    def take(cls, server: ServerProcess, processes: list[LoadProcess]) -> Snapshot:
        samples: Samples | None = None
        with contextlib.suppress(OSError):
            samples = scrape(server)
        return cls(
            time.monotonic(),
            time.time(),
            samples,
            tree_cpu_s(server.proc.pid),
            process_cpu_s(server.proc.pid),
            [process_cpu_s(p.popen.pid) for p in processes],
            host_report.cpu_busy_s(),
            host_report.own_cpu_s(),
        )


def delta(before: Samples, after: Samples, name: str) -> float:
    """The change of the sum of every series named `name` (0 when absent)."""
    total = lambda s: sum(v for (n, _), v in s.items() if n == name)  # noqa: E731
    return total(after) - total(before)


def histogram_mean(before: Samples, after: Samples, name: str, scale: float) -> float | None:
    """The mean observation of histogram `name` between two scrapes, times `scale`."""
    count = delta(before, after, f"{name}_count")
    return round(scale * delta(before, after, f"{name}_sum") / count, 4) if count else None


def histogram_quantile(
    before: Samples, after: Samples, name: str, q: float, scale: float
) -> float | None:
    """The q-quantile of histogram `name`'s observations between two scrapes, times `scale`,
    as Prometheus's histogram_quantile estimates it: linear within the bucket it falls in (the
    largest finite bound when it falls beyond)."""
    bounds: dict[float, float] = {}
    for (series, labels), value in after.items():
        if series == f"{name}_bucket":
            le = float(dict(labels)["le"])
            bounds[le] = value - before.get((series, labels), 0.0)
    total = bounds.get(math.inf, 0.0)
    if not total:
        return None
    rank, lower, below = q * total, 0.0, 0.0
    for bound in sorted(bounds):
        count = bounds[bound]
        if count >= rank:
            if math.isinf(bound):
                return round(scale * lower, 4)
            share = (rank - below) / (count - below) if count > below else 1.0
            return round(scale * (lower + share * (bound - lower)), 4)
        lower, below = bound, count
    return round(scale * lower, 4)


class GpuSampler:
    """`nvidia-smi`'s utilization.gpu of every GPU every GPU_SAMPLE_S while open; no samples
    (None) on a machine without nvidia-smi."""

    def __init__(self) -> None:
        self.binary = shutil.which("nvidia-smi")
        self.samples: list[list[float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-sampler", daemon=True)

    def __enter__(self) -> GpuSampler:
        if self.binary is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)

    def _run(self) -> None:
        assert self.binary is not None
        query = [self.binary, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"]
        while not self._stop.is_set():
            started = time.monotonic()
            with contextlib.suppress(OSError, ValueError, subprocess.SubprocessError):
                done = subprocess.run(query, capture_output=True, text=True, timeout=5)
                if done.returncode == 0:
                    self.samples.append([float(x) for x in done.stdout.split()])
            self._stop.wait(max(0.0, GPU_SAMPLE_S - (time.monotonic() - started)))

    def figures(self) -> dict[str, Any]:
        """Mean busy % per GPU over the samples, and the busiest GPU's (the table's)."""
        if self.binary is None or not self.samples:
            return {"gpu_busy_pct": None, "gpu_busy_pct_per_gpu": None, "gpu_samples": 0}
        width = min(len(s) for s in self.samples)
        per_gpu = np.mean([s[:width] for s in self.samples], axis=0).round(1).tolist()
        return {
            "gpu_busy_pct": max(per_gpu) if per_gpu else None,
            "gpu_busy_pct_per_gpu": per_gpu,
            "gpu_samples": len(self.samples),
        }


def percentiles_ms(seconds: list[float]) -> dict[str, float | None]:
    """p50 / p99 in ms (None without calls: a process that never got an answer)."""
    if not seconds:
        return {"p50_ms": None, "p99_ms": None, "n": 0}
    p50, p99 = np.percentile(1e3 * np.asarray(seconds), [50, 99])
    return {"p50_ms": round(float(p50), 3), "p99_ms": round(float(p99), 3), "n": len(seconds)}


def actor_done(out: Path) -> dict[str, Any] | None:
    """The figures of an actor's `done:` line (None when it printed none)."""
    lines = [line for line in tail(out).splitlines() if line.startswith("done:")]
    if not lines:
        return None
    figures: dict[str, Any] = {"line": lines[-1]}
    counts = DONE_COUNTS.match(lines[-1])
    if counts is not None:
        figures.update(zip(("rollouts", "trained", "stale", "ahead"), map(int, counts.groups()),
                           strict=True))  # fmt: skip
    for name, p50, p99 in DONE_LATENCY.findall(lines[-1]):
        figures[f"{name.lower()}_p50_ms"] = float(p50)
        figures[f"{name.lower()}_p99_ms"] = float(p99)
    return figures


# ------------------------------------------------------------------------------- a cell
def server_settings(load: Load, args: argparse.Namespace) -> list[str]:
    """The load's model shape and a short drain, the server's defaults otherwise (its Step
    queue and policy lag too: what a user gets); then the user's --set (a tuned row)."""
    return [*load.shape, "server.shutdown_grace_s=5", *args.set]


def num_envs(load: Load, args: argparse.Namespace) -> int:
    """--num-envs, or the load's own default (CartPole's envs cost more per step than LobSim's)."""
    return args.num_envs or load.default_num_envs


def wait_until(moment: float, processes: list[LoadProcess], server: ServerProcess) -> bool:
    """Watch the processes until `moment`; False as soon as the server has exited."""
    while True:
        for process in processes:
            process.watch()
        if server.proc.poll() is not None:
            return False
        left = moment - time.monotonic()
        if left <= 0:
            return True
        time.sleep(min(POLL_S, left))


def measure(
    cell: dict[str, Any],
    server: ServerProcess,
    processes: list[LoadProcess],
    warmup: float,
    duration: float,
    profile: Path | None = None,
    profile_gil: bool = False,
) -> tuple[float, float] | None:
    """Wait for the processes to start, then take the window's figures into `cell` (and with
    `profile`, py-spy's raw samples of the server over the window there); the window's
    (start, end) on time.monotonic, or None when there was none."""
    deadline = time.monotonic() + PROCESS_START_S
    while not all(p.settled for p in processes) and time.monotonic() < deadline:
        if not wait_until(time.monotonic() + POLL_S, processes, server):
            break
    ready = [p.ready_at for p in processes if p.ready_at is not None]
    if server.proc.poll() is not None:
        cell["errors"].append("no window: the server exited before the processes started")
        return None
    if not ready:
        cell["errors"].append(f"no window: no process started within {PROCESS_START_S:g} s")
        return None
    start, end = max(ready) + warmup, min(ready) + duration
    cell["start_spread_s"] = round(max(ready) - min(ready), 3)
    if end - start < MIN_WINDOW_S:
        cell["errors"].append(
            f"no window: the processes started {cell['start_spread_s']} s apart, more than "
            "--duration minus --warmup"
        )
        return None
    if not wait_until(start, processes, server):
        cell["errors"].append("the server exited during the warm-up")
        return None
    # ... and after the first Step: it captures its shape's graphs (seconds on CUDA), and the
    # rollouts that came meanwhile make the next Step follow at once
    while not server.events("step") and time.monotonic() < end - MIN_WINDOW_S:
        if not wait_until(time.monotonic() + POLL_S, processes, server):
            cell["errors"].append("the server exited before its first Step")
            return None
    cell["first_step_wait_s"] = round(max(0.0, time.monotonic() - start), 3)
    before = Snapshot.take(server, processes)
    spy = None if profile is None else start_profile(
        server.proc.pid, end - start, profile, profile_gil
    )
    with GpuSampler() as gpu:
        survived = wait_until(end, processes, server)
    after = Snapshot.take(server, processes)
    if spy is not None and profile is not None:
        cell["profile"] = finish_profile(spy, profile)
    seconds = after.at - before.at
    cell["window_s"] = round(seconds, 3)
    cell.update(gpu.figures())
    if not survived or before.samples is None or after.samples is None:
        cell["errors"].append("the server exited or stopped answering /metrics in the window")
        return before.at, after.at
    b, a = before.samples, after.samples
    samples = delta(b, a, "trident_samples_total")
    cell["samples_in_window"] = int(samples)
    cell["steps_in_window"] = int(delta(b, a, "trident_steps_total"))
    cell["env_steps_per_s_counter"] = round(samples / seconds, 1)
    rate = step_aligned_rate(server, before.wall, after.wall)
    if rate is None:
        cell["errors"].append(f"the window held {cell['steps_in_window']} Steps, fewer than "
                              f"{MIN_STEPS}: lengthen --duration")  # fmt: skip
    cell["rollouts_in_window"] = int(delta(b, a, "trident_rollouts_total"))
    cell["rollouts_dropped_in_window"] = int(delta(b, a, "trident_rollouts_dropped_total"))
    cell["env_steps_per_s"] = rate
    mean = lambda name, scale=1.0: histogram_mean(b, a, name, scale)  # noqa: E731
    cell["server_act_forward_mean_ms"] = mean("trident_act_duration_seconds", 1e3)
    cell["server_act_batch_mean"] = mean("trident_act_batch_size")
    cell["server_step_mean_ms"] = mean("trident_step_duration_seconds", 1e3)
    interact = "trident_interact_request_duration_seconds"
    cell["server_interact_ms"] = {
        "mean": mean(interact, 1e3),
        **{f"p{round(100 * q)}": histogram_quantile(b, a, interact, q, 1e3) for q in (0.5, 0.99)},
        "source": "the server's handler time of each Interact request in the window "
        "(trident_interact_request_duration_seconds, interpolated in its buckets)",
    }
    cell["rpc_errors_in_window"] = {
        f"{dict(labels)['method']}/{dict(labels)['code']}": value - b.get((name, labels), 0.0)
        for (name, labels), value in a.items()
        if name == "trident_rpc_errors_total" and value > b.get((name, labels), 0.0)
    }
    cores = lambda x, y: None if x is None or y is None else round((y - x) / seconds, 3)  # noqa: E731
    cell["server_cores"] = cores(before.server_cpu_s, after.server_cpu_s)
    # with server.front_ends: the learner process's share; the front ends' is the difference
    cell["learner_cores"] = cores(before.learner_cpu_s, after.learner_cpu_s)
    each = [cores(x, y) for x, y in zip(before.process_cpu_s, after.process_cpu_s, strict=True)]
    alive = [c for c in each if c is not None]
    cell["actor_cores"] = each
    cell["actor_cores_each"] = round(float(np.mean(alive)), 3) if alive else None
    machine = cores(before.machine_busy_s, after.machine_busy_s)
    cell["machine_cores_busy"] = machine
    if machine is not None and cell["server_cores"] is not None and None not in each:
        own = (after.own_cpu_s - before.own_cpu_s) / seconds
        cell["other_cores"] = round(max(0.0, machine - cell["server_cores"] - sum(alive) - own), 3)
    return before.at, after.at


def step_aligned_rate(server: ServerProcess, start: float, end: float) -> float | None:
    """Env steps trained per second between the first and the last Step that ended inside the
    window (wall clock, the server's `step` log lines): the samples of every Step after the
    first, over the time between them. A learner's Step trains hundreds of thousands of env
    steps at once, so a counter's change over a window moves by whole Steps with where the
    window's edges fall; between two Steps' ends it does not. None with fewer than MIN_STEPS."""
    ends = [(e["ts"], e["samples"]) for e in server.events("step")
            if start <= e["ts"] <= end and not e.get("skipped")]  # fmt: skip
    if len(ends) < MIN_STEPS:
        return None
    return round(sum(n for _, n in ends[1:]) / (ends[-1][0] - ends[0][0]), 1)


def start_profile(
    pid: int, seconds: float, out: Path, gil: bool = False
) -> subprocess.Popen[str] | None:
    """py-spy sampling the server's threads for `seconds` (with `gil`, only the thread holding
    the GIL); None where py-spy is missing."""
    binary = shutil.which("py-spy")
    if binary is None:
        return None
    command = [binary, "record", "--pid", str(pid), "--duration", str(max(1, int(seconds))),
               "--rate", "50", "--format", "raw", "--threads", "--nonblocking", "-o", str(out),
               *(["--gil"] if gil else [])]  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


# A sample's share by the server thread it was taken on: what each part of the server costs.
PROFILE_PARTS = (
    ("step worker", "trident-steps"),
    ("act batcher", "trident-act"),
    ("Interact handlers", "_interact"),
    ("unary handlers", "_server.py"),
)


def finish_profile(spy: subprocess.Popen[str], out: Path) -> dict[str, Any]:
    """The profile's share of samples per server part and its ten busiest leaf frames."""
    try:
        _, err = spy.communicate(timeout=PROFILE_WAIT_S)
    except subprocess.TimeoutExpired:
        spy.kill()
        return {"error": "py-spy did not finish"}
    if spy.returncode != 0 or not out.exists():
        return {"error": f"py-spy exited {spy.returncode}: {err[-TAIL_CHARS:]}"}
    parts: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    total = 0
    for line in out.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        part = next((name for name, mark in PROFILE_PARTS if mark in stack), "other")
        parts[part] += n
        leaves[stack.split(";")[-1]] += n
    share = lambda n: round(100 * n / total, 1) if total else None  # noqa: E731
    return {
        "file": out.name,
        "samples": total,
        "share_pct": {name: share(n) for name, n in parts.most_common()},
        "top_leaves_pct": {name: share(n) for name, n in leaves.most_common(10)},
    }


def latency_figures(
    cell: dict[str, Any], processes: list[LoadProcess], window: tuple[float, float] | None
) -> None:
    """Each process's own figures into `cell`, and the cell's Act / Step latency."""
    figures: list[dict[str, Any]] = []
    window_act: list[float] = []
    for p in processes:
        entry: dict[str, Any] = {
            "index": p.index,
            "exit": p.popen.returncode,
            "start_line": p.start_line,
        }
        if p.record is not None:
            with contextlib.suppress(OSError, ValueError):
                record = json.loads(p.record.read_text())
                act = percentiles_ms(record["act_s"])
                entry.update(
                    steps=record["steps"], applied=record["applied"], stale=record["stale"],
                    acts=len(record["act_s"]), act_p50_ms=act["p50_ms"], act_p99_ms=act["p99_ms"],
                    step=percentiles_ms(record["step_s"]), error=record["error"],
                )  # fmt: skip
                if window is not None:
                    window_act += [
                        s for t, s in zip(record["act_end"], record["act_s"], strict=True)
                        if window[0] <= t <= window[1]
                    ]  # fmt: skip
        else:
            entry["done"] = actor_done(p.out)
        early = window is not None and p.exited_at is not None and p.exited_at < window[1]
        if p.popen.returncode not in (0, None) or early or (p.record is None and not entry["done"]):
            entry["stderr_tail"] = tail(p.err)
            cell["errors"].append(f"process {p.index} exited with {p.popen.returncode}"
                                  f"{' before the window closed' if early else ''}")  # fmt: skip
        figures.append(entry)
    cell["processes"] = figures
    if processes and processes[0].record is not None:
        act = percentiles_ms(window_act)
        cell["act"] = {**act, "source": "every worker's Acts in the window, pooled"}
    else:
        done = [f["done"] for f in figures if f.get("done") and "act_p50_ms" in f["done"]]
        cell["act"] = {
            "p50_ms": float(np.median([d["act_p50_ms"] for d in done])) if done else None,
            "p99_ms": max(d["act_p99_ms"] for d in done) if done else None,
            "n": len(done),
            "source": "the actors' done lines (whole run): median of p50, largest p99",
        }


def run_cell(load: Load, actors: int, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """One (load, K) cell on a server of its own; every process stopped before it returns."""
    workdir = root / f"{load.name}-{actors}"
    workdir.mkdir(parents=True)
    N = num_envs(load, args)
    sets = server_settings(load, args)
    cell: dict[str, Any] = {
        "load": load.name,
        "actors": actors,
        "num_envs": N,
        "rollout_len": args.rollout_len,
        "server_set": sets,
        "errors": [],
    }
    try:
        server = ServerProcess.start(
            workdir, sets, startup_timeout_s=SERVER_START_S, dies_with_parent=True,
            # DEBUG: each Step's own log line, which the window's rate is read from
            env={"PYTHONPATH": child_env()["PYTHONPATH"], "TRIDENT_SERVER__LOG_LEVEL": "DEBUG"},
        )  # fmt: skip
    except RuntimeError as error:
        cell["errors"].append(f"the server did not start: {str(error)[-TAIL_CHARS:]}")
        return cell
    processes: list[LoadProcess] = []
    window = None
    try:
        for index in range(actors):
            command, record = load_command(load, index, server.target, N, args, workdir)
            processes.append(spawn(command, index, record, workdir))
        profile = None if args.profile_dir is None else (
            args.profile_dir / f"profile_{load.name}_{actors}.txt")  # fmt: skip
        window = measure(
            cell, server, processes, args.warmup, args.duration, profile, args.profile_gil
        )
        if window is not None:  # let each process end by itself: an actor's done line
            planned_end = max(p.ready_at or 0.0 for p in processes) + args.duration + LINGER_S
            deadline = max(time.monotonic(), planned_end) + EXIT_WAIT_S
            while any(p.popen.poll() is None for p in processes) and time.monotonic() < deadline:
                wait_until(time.monotonic() + POLL_S, processes, server)
        run_totals(cell, server)
    finally:
        for process in processes:
            stop(process.popen)
        server_exit = server.terminate(STOP_TIMEOUT_S)
    cell["server_exit"] = server_exit
    if server_exit != 0:
        cell["server_stderr_tail"] = server.stderr()[-TAIL_CHARS:]
        cell["errors"].append(f"the server exited with {server_exit}")
    latency_figures(cell, processes, window)
    return cell


def run_totals(cell: dict[str, Any], server: ServerProcess) -> None:
    """The server's rollout counts over the whole cell, once its processes have ended: how many
    it was handed and how many it dropped, by reason."""
    with contextlib.suppress(OSError):
        samples = scrape(server)
        dropped = {dict(labels)["reason"]: int(value) for (name, labels), value in samples.items()
                   if name == "trident_rollouts_dropped_total" and value}  # fmt: skip
        cell["run_rollouts"] = int(delta({}, samples, "trident_rollouts_total"))
        cell["run_rollouts_dropped"] = dropped
        cell["run_steps"] = int(delta({}, samples, "trident_steps_total"))


# ------------------------------------------------------------------------------- report
def add_scaling(cells: list[dict[str, Any]]) -> None:
    """rate(K) / (K rate(1)) of each cell whose load was measured at K = 1 (the median rate)."""
    single = {c["load"]: c.get("env_steps_per_s") for c in cells if c["actors"] == 1}
    for cell in cells:
        rate, base = cell.get("env_steps_per_s"), single.get(cell["load"])
        cell["scaling"] = round(rate / (cell["actors"] * base), 3) if rate and base else None


def median_of(cells: list[dict[str, Any]], *path: str) -> float | None:
    """The median of the figure at `path` (keys into each cell) over the cells that have it."""
    values = []
    for cell in cells:
        value: Any = cell
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if value is not None:
            values.append(value)
    return float(np.median(values)) if values else None


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (load, K) over its runs: the median env steps/s and its spread (the runs'
    largest distance from the median, as a share of it), the medians of the other figures, the
    rollouts dropped over every run whole, and each run's rate."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault((run["load"], run["actors"]), []).append(run)
    rows = []
    for (load, actors), cells in groups.items():
        rates = [c["env_steps_per_s"] for c in cells if c.get("env_steps_per_s") is not None]
        median = median_of(cells, "env_steps_per_s")
        rollouts = sum(c.get("run_rollouts", 0) for c in cells)
        dropped: Counter[str] = Counter()
        for cell in cells:
            dropped.update(cell.get("run_rollouts_dropped", {}))
        row = {
            "load": load,
            "actors": actors,
            "num_envs": cells[0]["num_envs"],
            "runs": len(cells),
            "env_steps_per_s": median,
            "env_steps_per_s_runs": rates,
            "spread": round(max(abs(r - median) for r in rates) / median, 4) if median else None,
            "rollouts": rollouts,
            "rollouts_dropped": dict(dropped),
            "dropped_share": round(sum(dropped.values()) / rollouts, 6) if rollouts else None,
            "act": {q: median_of(cells, "act", q) for q in ("p50_ms", "p99_ms")},
            "server_interact_p99_ms": median_of(cells, "server_interact_ms", "p99"),
            "errors": [f"run {c['run']}: {e}" for c in cells for e in c["errors"]],
            "other_cores": max((c.get("other_cores") or 0.0 for c in cells), default=None),
        }
        for name in ("steps_in_window", "server_act_forward_mean_ms", "server_cores",
                     "learner_cores", "actor_cores_each", "gpu_busy_pct"):  # fmt: skip
            row[name] = median_of(cells, name)
        rows.append(row)
    add_scaling(rows)
    return rows


def print_table(cells: list[dict[str, Any]]) -> None:
    def num(value: float | None, spec: str) -> str:
        return "-" if value is None or not math.isfinite(value) else format(value, spec)

    header = (
        f"{'load':<9} {'K':>3} {'actors×envs':>12} {'env steps/s':>12} {'spread':>7} "
        f"{'dropped':>11} {'Steps':>5} {'scaling':>7} {'Act p50':>8} {'p99':>8} {'srv p99':>8} "
        f"{'srv fwd':>8} {'server cores':>12} {'actor cores':>11} {'GPU busy':>8}"
    )
    print("\n" + header + "\n" + "-" * len(header))
    for c in cells:
        act = c.get("act", {})
        gpu = c.get("gpu_busy_pct")
        shape = f"{c['actors']}×{c['num_envs']}"
        dropped = f"{sum(c['rollouts_dropped'].values())}/{c['rollouts']}"
        print(
            f"{c['load']:<9} {c['actors']:>3} {shape:>12} "
            f"{num(c.get('env_steps_per_s'), ',.0f'):>12} {num(c.get('spread'), '.1%'):>7} "
            f"{dropped:>11} {num(c.get('steps_in_window'), '.0f'):>5} "
            f"{num(c.get('scaling'), '.2f'):>7} "
            f"{num(act.get('p50_ms'), '.2f'):>8} {num(act.get('p99_ms'), '.2f'):>8} "
            f"{num(c.get('server_interact_p99_ms'), '.2f'):>8} "
            f"{num(c.get('server_act_forward_mean_ms'), '.2f'):>8} "
            f"{num(c.get('server_cores'), '.2f'):>12} {num(c.get('actor_cores_each'), '.2f'):>11} "
            f"{'-' if gpu is None else f'{gpu:.0f}%':>8}"
        )
    print(
        "Each row: the median of its runs. spread: the runs' largest distance from the median"
        " env steps/s. dropped: rollouts the server dropped / was handed, every run whole."
        " Steps: Steps trained in the window. Act p50 / p99, srv p99 (an Interact request in"
        " the server's handler), srv fwd (the server's batched forward, mean): ms. Cores: CPU"
        " seconds per second of the window (actor cores: the mean process's)."
    )
    for c in cells:
        other = c.get("other_cores")
        if other is not None and other > OTHER_CORES_WARN:
            print(f"{c['load']} K={c['actors']}: other processes used {other:.2f} cores")
        for error in c["errors"]:
            print(f"{c['load']} K={c['actors']}: {error}")
        if c["rollouts_dropped"]:
            print(f"{c['load']} K={c['actors']}: dropped by reason {c['rollouts_dropped']}")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loads", nargs="+", choices=list(LOADS), default=list(LOADS),
                        help="what drives the server (default: all three)")
    parser.add_argument("--actors", type=int, nargs="+", default=[1, 3, 6, 12],
                        help="K: actor processes per cell")
    parser.add_argument("--num-envs", type=int,
                        help="environments per process (default: lobsim 1024, cartpole 512, "
                        "loadgen 1024)")
    parser.add_argument("--rollout-len", type=int, default=32, help="T: env steps per Step")
    parser.add_argument("--runs", type=int, default=3,
                        help="runs of each cell (a server and its processes each); the table "
                        "shows their median and spread")
    parser.add_argument("--duration", type=float, default=20.0,
                        help="seconds each process runs in a cell")
    parser.add_argument("--warmup", type=float, default=5.0,
                        help="seconds after the last process started left out of the window")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a server setting (repeatable), after the bench's own")
    parser.add_argument("--actor-arg", action="append", default=[], metavar="ARG",
                        help="an argument for every `trident actor` (repeatable; "
                        "--actor-arg=--set ... for one that starts with a dash)")
    parser.add_argument("--protocol", choices=sorted(PROTOCOLS), default="interact",
                        help="the loadgen workers' calls")
    parser.add_argument("--env-groups", type=int, default=1,
                        help="the loadgen's env groups on its Interact stream (trident actor's "
                        "--env-groups: --actor-arg)")
    parser.add_argument("--env-ms", type=float, default=0.0,
                        help="the loadgen's env step in wall time (ms, a sleep): a paced load, "
                        "e.g. 35 for LobSim's 1,024 markets on the H200 host")
    parser.add_argument("--profile-gil", action="store_true",
                        help="with --profile-dir: sample only the thread holding the GIL "
                        "(py-spy --gil), which shows who the others wait for")
    parser.add_argument("--out", type=Path, default=Path("bench/results/served.json"))
    parser.add_argument("--profile-dir", type=Path,
                        help="py-spy the server over each window into this folder (raw "
                        "samples per cell; shares per server thread in the JSON)")  # fmt: skip
    args = parser.parse_args(argv)
    for name in ("num_envs", "rollout_len", "duration"):
        value = getattr(args, name)
        if value is not None and not value > 0:
            parser.error(f"--{name.replace('_', '-')}: expected a positive number, got {value}")
    if not args.env_ms >= 0:
        parser.error(f"--env-ms: expected a non-negative number, got {args.env_ms}")
    if args.env_groups < 1 or (args.num_envs is not None and args.env_groups > args.num_envs):
        parser.error(f"--env-groups: expected 1 to --num-envs, got {args.env_groups}")
    if not 0 <= args.warmup < args.duration or min(args.actors) < 1 or args.runs < 1:
        parser.error("expected 0 <= --warmup < --duration, every --actors >= 1, --runs >= 1")
    return args


def run_bench(args: argparse.Namespace) -> int:
    cells: list[dict[str, Any]] = []
    started = time.monotonic()
    versions = host_report.versions(PACKAGES)  # the tree the cells ran, from its start
    if args.profile_dir is not None:
        args.profile_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="served-") as tmp:
        for run in range(args.runs):  # run after run over every cell: drift spreads evenly
            for name in args.loads:
                for actors in args.actors:
                    print(f"{name} K={actors} run {run + 1}/{args.runs} ...", file=sys.stderr,
                          flush=True)  # fmt: skip
                    cell = run_cell(LOADS[name], actors, args, Path(tmp) / f"run{run}")
                    cells.append({**cell, "run": run})
    rows = summarise(cells)
    report = {
        "command": shlex.join([sys.executable, *sys.argv]),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": host_report.machine(),
        "versions": versions,
        "git_commit_at_end": host_report.git_commit(),
        "settings": {
            "loads": args.loads,
            "actors": args.actors,
            "num_envs": {name: num_envs(LOADS[name], args) for name in args.loads},
            "rollout_len": args.rollout_len,
            "runs": args.runs,
            "duration_s": args.duration,
            "warmup_s": args.warmup,
            "set": args.set,
            "actor_arg": args.actor_arg,
            "protocol": args.protocol,
            "env_groups": args.env_groups,
            "env_ms": args.env_ms,
            "profile_gil": args.profile_gil,
            "transport": "plaintext gRPC over 127.0.0.1: the actors' own calls (each process's "
            "start_line), the loadgen workers' --protocol",
        },
        "rows": rows,
        "cells": cells,
        "runtime_s": round(time.monotonic() - started, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print_table(rows)
    print(f"runtime {report['runtime_s']} s; wrote {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--worker" in argv:
        return run_worker(parse_worker_args(argv))
    return run_bench(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
