"""What gRPC costs: Step throughput and Act latency over loopback against the same work in-process.

A real `trident serve` subprocess (plaintext, 127.0.0.1, ports picked by the OS) and an
in-process `Trainer` are built from the same settings and seed, then fed the same rollouts in
the same order, so both do exactly the same arithmetic (the script checks that their parameter
digests agree at the end). Each size is timed in `--rounds` rounds of one in-process block and
one gRPC block, each block after a `--settle` pause and `--warmup` untimed calls: calls are not
interleaved one by one, because a call that directly follows the other process's call shares
the cores with that process's still-spinning BLAS threads.

    python bench/grpc_step.py                         # B = 256 1024 4096 16384; Act N = 1 .. 4096
    python bench/grpc_step.py --sizes 4096 --repeats 40 --act-sizes 1 256

Per rollout size B = T·N: K Steps each way (`Trainer.step` vs `TridentClient.step`), samples/s
from the median, the overhead %, the server's own `timings_ms` from each reply (so wall − server
total = what the transport and the server's plumbing cost), and the pure serialize + parse +
validate cost of one StepRequest. A third column calls the server's own servicer and engine
(around a third trainer) in this process, without serialization or gRPC, which splits that cost
into the service's plumbing and gRPC's. Per Act size: p50 / p99 of single calls, in-process vs
gRPC (and the servicer in-process), with the server's act batcher at its default
`server.act_max_wait_ms` and at 0. The server's metrics endpoint gives the engine's Step time and
the batched Act forward. Writes JSON (command, date, machine, versions, config, results) to
--out and prints the tables.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import os
import shlex
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry

from service import logs
from service.api.tensors import decode, encode
from service.api.trident.v1 import trainer_pb2 as pb
from service.client.client import StepReply, TridentClient, step_reply, step_request
from service.config import Config, ServerConfig, load_config, with_overrides
from service.server.engine import Engine
from service.server.metrics import Metrics
from service.server.servicer import TrainerServicer
from service.server.validation import rollout_from_request
from service.testing import host_report
from service.testing.serverproc import ServerProcess
from service.testing.serverproc import scrape as scrape_samples
from service.trainer.trainer import Trainer
from service.types import ActMode, ActResult, Rollout

D, H, DEPTH, A, Z, K = 40, 256, 2, 9, 51, 3
THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_CORETYPE")
PACKAGES = ("numpy", "grpcio", "protobuf", "trident")


# ------------------------------------------------------------------------------- config
def overrides(args: argparse.Namespace) -> list[str]:
    """Settings shared by the in-process trainer and the server (`--set` each)."""
    return [
        "train.backend=numpy",
        "model.dtype=float32",
        f"model.obs_dim={D}",
        f"model.hidden_dim={H}",
        f"model.depth={DEPTH}",
        f"model.num_actions={A}",
        f"model.aux_dim={K}",
        f"c51.num_atoms={Z}",
        f"ppo.epochs={args.epochs}",
        f"ppo.num_minibatches={args.minibatches}",
        f"replay.capacity={args.replay_capacity}",
        f"replay.batch_size={args.replay_batch}",
        f"replay.min_size={args.replay_batch}",  # reached by the first Step: the Q head runs
        f"train.rollout_len={args.horizon}",
        f"train.seed={args.seed}",
        "checkpoint.every_steps=0",
    ]


def server_overrides(args: argparse.Namespace, act_max_wait_ms: float | None) -> list[str]:
    extra = [f"server.max_message_mb={message_mb(args)}", "server.shutdown_grace_s=2"]
    if act_max_wait_ms is not None:
        extra.append(f"server.act_max_wait_ms={act_max_wait_ms:g}")
    return [*overrides(args), *extra]


def message_mb(args: argparse.Namespace) -> int:
    """A message limit with room for the largest rollout (the default 64 MiB when that fits)."""
    biggest = max(args.sizes)
    rows = biggest + biggest // args.horizon  # obs carries T+1 rows per env
    need = rows * (D + K + 4) * 4 + biggest * 16
    return max(ServerConfig().max_message_mb, 2 * need // 2**20 + 1)


# ------------------------------------------------------------------------------- data
def make_rollout(B: int, horizon: int, rng: np.random.Generator) -> Rollout:
    """A rollout with every field the API carries, in the dtypes the wire uses."""
    if B % horizon:
        raise SystemExit(f"--sizes: expected multiples of --horizon {horizon}, got {B}")
    T, N = horizon, B // horizon
    logits = rng.normal(size=(T, N, A))
    log_pi = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    actions = rng.integers(0, A, size=(T, N))
    truncated = rng.random((T, N)) < 0.01
    terminated = (rng.random((T, N)) < 0.02) & ~truncated
    index = np.flatnonzero(truncated.reshape(-1))
    return Rollout(
        obs=rng.normal(size=(T + 1, N, D)).astype(np.float32),
        actions=actions.astype(np.int32),
        rewards=rng.normal(size=(T, N)).astype(np.float32),
        terminated=terminated.astype(np.uint8),
        truncated=truncated.astype(np.uint8),
        behavior_log_probs=np.take_along_axis(log_pi, actions[..., None], -1)[..., 0].astype(
            np.float32
        ),
        final_obs=rng.normal(size=(index.size, D)).astype(np.float32),
        final_obs_index=index.astype(np.int64),
        bce_labels=(rng.random((T, N)) < 0.5).astype(np.uint8),
        aux_targets=rng.normal(size=(T, N, K)).astype(np.float32),
    )


# ------------------------------------------------------------------------------- stats
def ms(seconds: list[float]) -> np.ndarray:
    return 1e3 * np.asarray(seconds, dtype=np.float64)


def summary(values_ms: np.ndarray | list[float]) -> dict[str, Any]:
    v = np.asarray(values_ms, dtype=np.float64)
    return {
        "median_ms": float(np.median(v)),
        "p10_ms": float(np.percentile(v, 10)),
        "p90_ms": float(np.percentile(v, 90)),
        "min_ms": float(v.min()),
        "n": int(v.size),
        "samples_ms": [round(float(x), 3) for x in v],
    }


def latency(values_ms: np.ndarray) -> dict[str, Any]:
    return {
        "p50_ms": float(np.percentile(values_ms, 50)),
        "p99_ms": float(np.percentile(values_ms, 99)),
        "mean_ms": float(values_ms.mean()),
        "min_ms": float(values_ms.min()),
        "max_ms": float(values_ms.max()),
        "n": int(values_ms.size),
    }


# ------------------------------------------------------------------------------- server
def scrape(server: ServerProcess) -> dict[str, float]:
    """The server's unlabelled Prometheus samples (sums and counts of its histograms)."""
    return {
        name: value
        for (name, labels), value in scrape_samples(server).items()
        if name.startswith("trident_") and not labels
    }


def connect(server: ServerProcess, args: argparse.Namespace) -> TridentClient:
    client = TridentClient(
        f"127.0.0.1:{server.port}", timeout_s=600.0, max_message_mb=message_mb(args)
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            if client.health() == "SERVING":
                return client
        except Exception:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.05)


# ------------------------------------------------------------------------------- no network
class DirectContext:
    """The little of grpc.ServicerContext that TrainerServicer asks for."""

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return ()

    def set_trailing_metadata(self, metadata: object) -> None:
        pass

    def is_active(self) -> bool:
        return True

    def abort(self, code: object, details: str) -> None:
        raise RuntimeError(f"{code}: {details}")


class Direct:
    """The server's own servicer + engine + a third trainer, called in this process: the
    request is built and the reply read exactly as TridentClient does, but no bytes are
    serialized and no gRPC runtime runs. gRPC wall − this = what gRPC itself costs."""

    def __init__(self, config: Config, checkpoint_dir: Path) -> None:
        config = with_overrides(config, [f"checkpoint.dir={checkpoint_dir}"])
        self.servicer = TrainerServicer(Metrics(CollectorRegistry()))
        self.engine = Engine(Trainer(config), self.servicer.metrics)
        self.servicer.attach(self.engine)
        self.context = DirectContext()

    def step(self, rollout: Rollout) -> StepReply:
        reply = self.servicer.Step(step_request(rollout), self.context)  # type: ignore[arg-type]
        return step_reply(reply)

    def act(self, obs: np.ndarray) -> ActResult:
        request = pb.ActRequest(obs=encode(np.asarray(obs, "<f4")), mode=pb.ACT_MODE_SAMPLE)
        reply = self.servicer.Act(request, self.context)  # type: ignore[arg-type]
        return ActResult(
            actions=decode(reply.actions, "actions", (pb.D_TYPE_INT32,)),
            log_probs=decode(reply.log_probs, "log_probs", (pb.D_TYPE_FLOAT32,)),
            values=decode(reply.values, "values", (pb.D_TYPE_FLOAT32,)),
            policy_version=reply.policy_version,
        )

    def close(self) -> None:
        self.engine.drain()  # stops the engine's threads (and writes a final checkpoint)


def log_like_the_server() -> None:
    """Format the engine's per-Step JSON log line as the server does, into /dev/null, so the
    in-process servicer pays the same logging cost."""
    handler = logging.StreamHandler(open(os.devnull, "w"))  # noqa: SIM115
    handler.setFormatter(logs.JsonLines())
    logs.logger.handlers[:] = [handler]
    logs.logger.setLevel(logging.INFO)
    logs.logger.propagate = False


# ------------------------------------------------------------------------------- Step
def step_repeats(B: int, args: argparse.Namespace) -> int:
    """Fewer Steps at large B: `--repeats` up to B = 4096, scaled down beyond, at least 3."""
    return max(3, args.repeats * 4096 // max(B, 4096))


class HistogramDelta:
    """What server histograms observed during the timed parts of the gRPC blocks (sums and
    counts accumulated between scrapes of the metrics endpoint)."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.totals: dict[str, float] = {}
        self._before: dict[str, float] = {}

    def start(self) -> None:
        self._before = scrape(self.server)

    def stop(self) -> None:
        after = scrape(self.server)
        for name, value in after.items():
            if name.endswith(("_sum", "_count")):
                self.totals[name] = self.totals.get(name, 0.0) + value - self._before[name]

    def mean(self, histogram: str) -> float:
        count = self.totals.get(f"{histogram}_count", 0.0)
        return self.totals.get(f"{histogram}_sum", 0.0) / count if count else 0.0


def in_blocks(
    args: argparse.Namespace,
    repeats: int,
    calls: dict[str, Callable[[], Any]],
    meter: HistogramDelta,
) -> dict[str, list[tuple[float, Any]]]:
    """Time `repeats` calls of each side, in `--rounds` rounds of one block per side.

    Each block first sleeps `--settle` s, so the other process's BLAS threads have stopped
    spinning (on a small machine, a call made right after the other process's call runs up
    to 2x slower while they spin), then makes `--warmup` untimed calls. The side that goes
    first alternates between rounds. The "grpc" side's timed calls are bracketed by scrapes
    of the server's metrics.
    """
    per_round = -(-repeats // args.rounds)
    timed: dict[str, list[tuple[float, Any]]] = {side: [] for side in calls}
    for round_index in range(args.rounds):
        sides = list(calls) if round_index % 2 == 0 else list(calls)[::-1]
        for side in sides:
            time.sleep(args.settle)
            for _ in range(args.warmup):
                calls[side]()
            if side == "grpc":
                meter.start()
            for _ in range(min(per_round, repeats - len(timed[side]))):
                started = time.perf_counter()
                out = calls[side]()
                timed[side].append((time.perf_counter() - started, out))
            if side == "grpc":
                meter.stop()
    return timed


def bench_steps(
    B: int,
    trainer: Trainer,
    direct: Direct,
    client: TridentClient,
    server: ServerProcess,
    args: argparse.Namespace,
) -> dict[str, Any]:
    rollout = make_rollout(B, args.horizon, np.random.default_rng([args.seed, B]))
    repeats = step_repeats(B, args)
    meter, foreign = HistogramDelta(server), ForeignCpu(server)
    calls = {
        "in_process": lambda: trainer.step(rollout),
        "servicer": lambda: direct.step(rollout),
        "grpc": lambda: client.step(rollout),
    }
    timed = in_blocks(args, repeats, calls, meter)
    foreign_share = foreign.share()
    for side, runs in timed.items():
        for _, result in runs:
            if result.updates_applied != args.epochs * args.minibatches or "q" not in result.losses:
                raise RuntimeError(
                    f"B={B} {side}: a Step applied {result.updates_applied} updates with losses "
                    f"{sorted(result.losses)}; expected every update, the Q head's included"
                )
    engine_ms = 1e3 * meter.mean("trident_step_duration_seconds")

    local = ms([wall for wall, _ in timed["in_process"]])
    local_total = np.asarray([result.timings_ms["total"] for _, result in timed["in_process"]])
    remote = ms([wall for wall, _ in timed["grpc"]])
    server_ms: dict[str, list[float]] = {}
    for _, reply in timed["grpc"]:
        for key, value in reply.timings_ms.items():
            server_ms.setdefault(key, []).append(value)
    server_total = np.asarray(server_ms["total"])
    queue = np.asarray(server_ms.get("queue", np.zeros_like(server_total)))
    outside_remote = remote - server_total  # per call: everything but the trainer's own work
    outside_local = local - local_total  # in-process: validation + finiteness checks
    local_med, remote_med = float(np.median(local)), float(np.median(remote))
    direct_wall = ms([wall for wall, _ in timed["servicer"]])
    direct_total = np.asarray([reply.timings_ms["total"] for _, reply in timed["servicer"]])
    outside_direct = direct_wall - direct_total
    # Means (a histogram gives no median): the gRPC wall time split into the trainer's own
    # work, the engine around it (lock, validate_rollout + finiteness check again), the queue
    # hand-off, and the rest (client encode, HTTP/2 over loopback, server decode/validation,
    # thread hops, reply).
    trainer_mean = float(server_total.mean())
    split = {
        "grpc_wall": float(remote.mean()),
        "trainer_total": trainer_mean,
        "engine_around_trainer": engine_ms - trainer_mean,
        "queue_handoff": float(queue.mean()),
        "rpc_rest": float(remote.mean()) - engine_ms - float(queue.mean()),
        "in_process_wall": float(local.mean()),
    }
    return {
        "B": B,
        "T": args.horizon,
        "N": B // args.horizon,
        "repeats": repeats,
        "rounds": args.rounds,
        "warmup_per_block": args.warmup,
        "request_bytes": step_request(rollout).ByteSize(),
        "in_process": {**summary(local), "samples_per_s": B / (local_med / 1e3)},
        "grpc": {**summary(remote), "samples_per_s": B / (remote_med / 1e3)},
        "overhead_pct": 100.0 * (remote_med / local_med - 1.0),
        # Paired per call, so unaffected by the two trainers running at different speeds:
        # median of (wall − server trainer total) per gRPC call, minus the in-process
        # equivalent (wall − trainer total), over the in-process median wall time.
        "overhead_pct_transport": 100.0
        * (float(np.median(outside_remote)) - float(np.median(outside_local)))
        / local_med,
        "server_timings_ms": {k: float(np.median(v)) for k, v in server_ms.items()},
        "grpc_wall_minus_server_total_ms": float(np.median(outside_remote)),
        "grpc_wall_minus_server_total_minus_queue_ms": float(np.median(outside_remote - queue)),
        "in_process_wall_minus_total_ms": float(np.median(outside_local)),
        # The server's servicer + engine called in this process (no serialization, no gRPC):
        # its wall − its trainer total is the service's own plumbing (decode, validation,
        # queue hop, lock, metrics, log, reply); gRPC's wall-minus-total minus this one is
        # what serialization + HTTP/2 over loopback + the gRPC runtime add.
        "servicer_in_process": {
            **summary(direct_wall),
            "wall_minus_trainer_total_ms": float(np.median(outside_direct)),
        },
        "grpc_runtime_ms": float(np.median(outside_remote)) - float(np.median(outside_direct)),
        "mean_split_ms": split,
        "other_processes_cpu_share": foreign_share,
    }


def bench_transport(B: int, config: Config, args: argparse.Namespace) -> dict[str, Any]:
    """Serialize + parse + decode/validate one StepRequest, without a network or a server."""
    rollout = make_rollout(B, args.horizon, np.random.default_rng([args.seed, B]))
    parts: dict[str, list[float]] = {"build": [], "serialize": [], "parse": [], "decode": []}
    size, warmup = 0, max(2, args.warmup)
    time.sleep(args.settle)
    for i in range(warmup + step_repeats(B, args) * 2):
        t0 = time.perf_counter()
        message = step_request(rollout)  # astype copies + Tensor(data=bytes) per field
        t1 = time.perf_counter()
        wire = message.SerializeToString()
        t2 = time.perf_counter()
        parsed = pb.StepRequest.FromString(wire)
        t3 = time.perf_counter()
        decoded = rollout_from_request(parsed, config)  # np.frombuffer + checks, as the server
        t4 = time.perf_counter()
        if i >= warmup:
            for key, value in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                parts[key].append(value)
        size = len(wire)
    if not np.array_equal(decoded.obs, rollout.obs):
        raise RuntimeError("transport round trip changed obs")
    medians = {f"{k}_ms": float(np.median(ms(v))) for k, v in parts.items()}
    total = ms(parts["build"]) + ms(parts["serialize"]) + ms(parts["parse"]) + ms(parts["decode"])
    return {
        "B": B,
        "wire_bytes": size,
        **medians,
        "total_ms": float(np.median(total)),
        "wire_mb_per_s": size / 2**20 / (float(np.median(total)) / 1e3),
    }


def null_rpc(client: TridentClient, calls: int) -> dict[str, Any]:
    """Round trip of the cheapest unary call (grpc.health.v1 Check): the per-call floor."""
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        client.health()
        times.append(time.perf_counter() - started)
    return latency(ms(times))


# ------------------------------------------------------------------------------- Act
def act_repeats(N: int, args: argparse.Namespace) -> int:
    return max(20, args.act_repeats if N <= 256 else args.act_repeats // 4)


def bench_act(
    trainer: Trainer,
    direct: Direct,
    client: TridentClient,
    server: ServerProcess,
    args: argparse.Namespace,
) -> list[dict[str, Any]]:
    rows = []
    for N in args.act_sizes:
        obs = np.random.default_rng([args.seed, 7, N]).normal(size=(N, D)).astype(np.float32)
        meter, foreign = HistogramDelta(server), ForeignCpu(server)
        calls = {
            "in_process": lambda obs=obs: trainer.act(obs, ActMode.SAMPLE),
            "servicer": lambda obs=obs: direct.act(obs),
            "grpc": lambda obs=obs: client.act(obs),
        }
        timed = in_blocks(args, act_repeats(N, args), calls, meter)
        for side, runs in timed.items():
            if any(result.actions.shape != (N,) for _, result in runs):
                raise RuntimeError(f"Act N={N} {side}: expected {N} actions per call")
        rows.append(
            {
                "N": N,
                "in_process": latency(ms([t for t, _ in timed["in_process"]])),
                "grpc": latency(ms([t for t, _ in timed["grpc"]])),
                "servicer_in_process": latency(ms([t for t, _ in timed["servicer"]])),
                # The server's batched forward (under the engine lock) and rows per forward.
                "server_forward_mean_ms": 1e3 * meter.mean("trident_act_duration_seconds"),
                "server_batch_rows_mean": meter.mean("trident_act_batch_size"),
                "other_processes_cpu_share": foreign.share(),
            }
        )
    return rows


# ------------------------------------------------------------------------------- report
def versions() -> dict[str, Any]:
    found = host_report.versions(PACKAGES)
    from google.protobuf.internal import api_implementation

    found["protobuf_implementation"] = api_implementation.Type()
    with contextlib.suppress(Exception):
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        found["numpy_blas"] = f"{blas.get('name')} {blas.get('version')}"
    return found


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) of a running process."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return 0.0


class ForeignCpu:
    """The share of the machine's CPU that processes other than this one and the server used
    between `__init__` and `share()`: 0 on a quiet machine; above ~0.05 the timings are
    contended."""

    def __init__(self, server: ServerProcess) -> None:
        self.pid = server.proc.pid
        self.start = (time.perf_counter(), host_report.cpu_busy_s(), self._own())

    def _own(self) -> float:
        t = os.times()
        return t.user + t.system + process_cpu_s(self.pid)

    def share(self) -> float | None:
        wall0, busy0, own0 = self.start
        busy1 = host_report.cpu_busy_s()
        if busy0 is None or busy1 is None:
            return None
        foreign = max(0.0, busy1 - busy0 - (self._own() - own0))
        return round(foreign / ((time.perf_counter() - wall0) * (os.cpu_count() or 1)), 4)


def load() -> list[float] | None:
    with contextlib.suppress(OSError):
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    return None


def percent(share: float | None) -> str:
    return "?" if share is None else f"{100 * share:.0f}%"


def print_tables(report: dict[str, Any]) -> None:
    out = sys.stdout.write
    out("\nStep (median of K; samples/s = B / median; server = trainer total in the reply)\n")
    header = (
        f"{'B':>6} {'K':>3} | {'in-proc ms':>10} {'samples/s':>10} | {'gRPC ms':>9} "
        f"{'samples/s':>10} | {'overhead':>8} {'transport':>9} | {'server ms':>9} "
        f"{'wall-srv':>8} | {'ser+de ms':>9} {'MB':>5} | {'other':>5}\n"
    )
    out(header)
    out("-" * (len(header) - 1) + "\n")
    transport = {row["B"]: row for row in report["results"]["transport"]}
    for row in report["results"]["step"]:
        t = transport.get(row["B"], {})
        out(
            f"{row['B']:>6} {row['repeats']:>3} | {row['in_process']['median_ms']:>10.1f} "
            f"{row['in_process']['samples_per_s']:>10.0f} | {row['grpc']['median_ms']:>9.1f} "
            f"{row['grpc']['samples_per_s']:>10.0f} | {row['overhead_pct']:>7.1f}% "
            f"{row['overhead_pct_transport']:>8.1f}% | {row['server_timings_ms']['total']:>9.1f} "
            f"{row['grpc_wall_minus_server_total_ms']:>8.2f} | "
            f"{t.get('total_ms', float('nan')):>9.2f} {t.get('wire_bytes', 0) / 2**20:>5.2f} | "
            f"{percent(row['other_processes_cpu_share']):>5}\n"
        )
    out(
        "\nWhere a gRPC Step's time goes (means, ms): wall = trainer + engine around it + queue"
        " hand-off + rest of the RPC\n"
    )
    for row in report["results"]["step"]:
        m = row["mean_split_ms"]
        out(
            f"{row['B']:>6}: wall {m['grpc_wall']:8.2f} = trainer {m['trainer_total']:8.2f} + "
            f"engine {m['engine_around_trainer']:6.2f} + queue {m['queue_handoff']:5.2f} + "
            f"rpc {m['rpc_rest']:6.2f}   (in-process wall {m['in_process_wall']:8.2f})\n"
        )
    out(
        "\nNon-trainer time per Step (medians, ms): in-process Trainer.step | the server's servicer"
        " called in-process | over gRPC; gRPC runtime = the last two's difference\n"
    )
    for row in report["results"]["step"]:
        svc = row["servicer_in_process"]
        out(
            f"{row['B']:>6}: {row['in_process_wall_minus_total_ms']:6.2f} | "
            f"{svc['wall_minus_trainer_total_ms']:6.2f} | "
            f"{row['grpc_wall_minus_server_total_ms']:6.2f}   gRPC runtime "
            f"{row['grpc_runtime_ms']:6.2f}   (servicer wall median {svc['median_ms']:.1f})\n"
        )
    out("\nTransport alone, per Step (median ms): build StepRequest | serialize | parse | decode\n")
    for t in report["results"]["transport"]:
        out(
            f"{t['B']:>6}: {t['build_ms']:7.3f} | {t['serialize_ms']:7.3f} | {t['parse_ms']:7.3f} "
            f"| {t['decode_ms']:7.3f}  = {t['total_ms']:7.3f} ms ({t['wire_mb_per_s']:.0f} MiB/s)\n"
        )
    nr = report["results"]["null_rpc"]
    out(f"\nNull RPC (health Check) p50 {nr['p50_ms']:.3f} ms, p99 {nr['p99_ms']:.3f} ms\n")
    waits = report["results"]["act"]
    names = list(waits)
    out(
        "\nAct latency, single calls, ms (p50 / p99; svc = the servicer in-process, p50;"
        " fwd = the server's batched forward, mean)\n"
    )
    head = f"{'N':>6} | {'in-process':>15}" + "".join(f" | {'gRPC ' + n:>42}" for n in names)
    head += f" | {'other':>5}"
    out(head + "\n" + "-" * len(head) + "\n")
    for i, row in enumerate(waits[names[0]]):
        local = row["in_process"]
        line = f"{row['N']:>6} | {local['p50_ms']:>6.3f} / {local['p99_ms']:>6.3f}"
        for n in names:
            g = waits[n][i]["grpc"]
            fwd = waits[n][i]["server_forward_mean_ms"]
            svc = waits[n][i]["servicer_in_process"]["p50_ms"]
            line += (
                f" | {g['p50_ms']:>7.3f} / {g['p99_ms']:>7.3f} svc {svc:>6.3f} fwd {fwd:>6.3f}"
            )
        shares = [waits[n][i]["other_processes_cpu_share"] for n in names]
        worst = None if None in shares else max(shares)
        out(line + f" | {percent(worst):>5}\n")
    out(
        "\nother = share of the machine's CPU used by other processes while that row was timed"
        " (max over the Act servers); above 5 % the row is contended.\n"
    )


# ------------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 1024, 4096, 16384],
                        help="rollout sizes B = T*N (multiples of --horizon)")
    parser.add_argument("--act-sizes", type=int, nargs="+", default=[1, 16, 256, 4096],
                        help="observations per Act call")
    parser.add_argument("--repeats", type=int, default=30,
                        help="timed Steps per side up to B=4096 (scaled down above, min 3)")
    parser.add_argument("--act-repeats", type=int, default=300,
                        help="timed Act calls per side for N<=256 (a quarter above)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="blocks per side (in-process / gRPC alternate), per size")
    parser.add_argument("--settle", type=float, default=0.5,
                        help="seconds of sleep before each block (BLAS threads stop spinning)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls first, per block")
    parser.add_argument("--horizon", type=int, default=16, help="T; N = B / T")
    parser.add_argument("--epochs", type=int, default=2, help="ppo.epochs")
    parser.add_argument("--minibatches", type=int, default=4, help="ppo.num_minibatches")
    parser.add_argument("--replay-batch", type=int, default=256,
                        help="replay.batch_size (= replay.min_size)")
    parser.add_argument("--replay-capacity", type=int, default=100_000, help="replay.capacity")
    parser.add_argument("--act-wait-ms", type=float, nargs="+", default=[None, 0.0],
                        help="server.act_max_wait_ms values to measure Act with "
                        "(default: the config default, then 0)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("bench/results/grpc_step.json"))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    load_before, busy_before, own_before = load(), host_report.cpu_busy_s(), host_report.own_cpu_s()
    config = load_config(env={}, overrides=overrides(args))
    default_wait = ServerConfig().act_max_wait_ms
    waits = [default_wait if w is None else w for w in args.act_wait_ms]
    trainer = Trainer(config)
    log_like_the_server()
    results: dict[str, Any] = {"step": [], "transport": [], "act": {}}
    servers: dict[str, Any] = {}
    log = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731

    with tempfile.TemporaryDirectory(prefix="grpc-step-") as tmp:
        for index, wait in enumerate(waits):
            label = f"wait={wait:g}ms"
            sets = server_overrides(args, None if wait == default_wait else wait)
            direct_config = with_overrides(config, [f"server.act_max_wait_ms={wait}"])
            direct = Direct(direct_config, Path(tempfile.mkdtemp(prefix="direct-", dir=tmp)))
            checkpoints = Path(tempfile.mkdtemp(prefix="ckpt-", dir=tmp))
            with (
                ServerProcess.start(
                    Path(tmp), sets, checkpoint_dir=checkpoints, startup_timeout_s=120.0
                ) as server,
                connect(server, args) as client,
            ):
                servers[label] = {"set": sets, "serving": server.events("serving")[0]}
                if index == 0:  # Steps, transport and the null RPC once, on the first server
                    for B in args.sizes:
                        log(f"step B={B} ...")
                        results["step"].append(
                            bench_steps(B, trainer, direct, client, server, args)
                        )
                        results["transport"].append(bench_transport(B, config, args))
                    status = client.status()
                    digest = trainer.param_digest()
                    results["same_work"] = {
                        "global_step_in_process": trainer.global_step,
                        "global_step_server": status.global_step,
                        "global_step_servicer_in_process": direct.engine.trainer.global_step,
                        "param_digest_match": status.param_digest == digest
                        and direct.engine.trainer.param_digest() == digest,
                    }
                    results["null_rpc"] = null_rpc(client, args.act_repeats)
                log(f"act {label} ...")
                results["act"][label] = bench_act(trainer, direct, client, server, args)
                servers[label]["events"] = dict(
                    Counter(record.get("event", "") for record in server.events())
                )
            direct.close()

    busy_after, own = host_report.cpu_busy_s(), host_report.own_cpu_s() - own_before
    elapsed = time.perf_counter() - started
    foreign = None
    if busy_before is not None and busy_after is not None:
        foreign = max(0.0, busy_after - busy_before - own)
    report = {
        "command": shlex.join([sys.executable, *sys.argv]),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": host_report.machine(),
        "load_avg_before_after": [load_before, load()],
        # CPU time other processes used while this ran, as a share of the machine: a check
        # that nothing else competed for the cores (0 is a quiet machine).
        "other_processes_cpu_share": None
        if foreign is None
        else round(foreign / (elapsed * (os.cpu_count() or 1)), 4),
        "env": {name: os.environ.get(name) for name in THREAD_VARS},
        "versions": versions(),
        "bench": {
            "sizes": args.sizes,
            "act_sizes": args.act_sizes,
            "horizon": args.horizon,
            "repeats_per_size": {B: step_repeats(B, args) for B in args.sizes},
            "act_repeats_per_size": {N: act_repeats(N, args) for N in args.act_sizes},
            "rounds": args.rounds,
            "settle_s": args.settle,
            "warmup_per_block": args.warmup,
            "ppo_epochs": args.epochs,
            "ppo_minibatches": args.minibatches,
            "updates_per_step": args.epochs * args.minibatches,
            "rows_per_update": "B / minibatches rollout rows + replay.batch_size replay rows",
            "act_mode": "sample",
            "act_max_wait_ms": waits,
            "transport": "plaintext gRPC over 127.0.0.1, unary Step/Act, one caller",
        },
        "config": config.to_dict(),
        "servers": servers,
        "results": results,
        "runtime_s": round(elapsed, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print_tables(report)
    same = results["same_work"]
    print(
        f"\nsame work: {same['global_step_in_process']} Steps each side, parameter digests "
        f"{'match' if same['param_digest_match'] else 'DIFFER'}; runtime {report['runtime_s']} s; "
        f"other processes' CPU share {report['other_processes_cpu_share']}; wrote {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
