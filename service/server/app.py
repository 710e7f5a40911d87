"""`trident serve`: build the gRPC server in front of the learner (`Engine`), run it, drain it on
SIGTERM. With server.front_ends >= 1 the gRPC servers run in front-end processes of their own
instead (`server.split`)."""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health
from prometheus_client import CollectorRegistry

from service import logs
from service.backend import resolve_name
from service.backend.blas import single_blas_thread
from service.backend.host_memory import limit_malloc_arenas, retain_freed_memory
from service.backend.rendezvous import Topology
from service.config import Config, ConfigError, ServerConfig, with_overrides
from service.handoff import HandoffLimits
from service.server import split
from service.server.engine import Engine
from service.server.front_ends import front_end_count
from service.server.grpc_server import bind, bind_unix, build, server_credentials, set_serving
from service.server.learner_process import (
    build_engine,
    checked_start,
    log_serving,
    serve_metrics,
)
from service.server.metrics import Metrics
from service.server.ranks import Ranks, serve_host_rank
from service.server.servicer import TrainerServicer

SIGNAL_POLL_S = 0.5  # how often the main thread looks for a SIGTERM / SIGINT to drain on


@dataclass
class Running:
    """A started server: its ports and the pieces shutdown needs."""

    server: grpc.Server
    health: health.HealthServicer
    servicer: TrainerServicer
    engine: Engine
    port: int
    metrics_port: int
    ranks: Ranks | None = None  # the ranks past 0 of --world-size


def start(
    config: Config,
    inference_only: bool = False,
    restore: str | None = None,
    resume: bool = False,
    topology: Topology | None = None,
) -> Running:
    """Bind, start and mark SERVING once the trainer is built. Misconfiguration fails first.
    `topology`: this is rank 0 of ranks on several hosts, which connect to it first."""
    config = checked_start(config, inference_only, restore, resume)
    credentials = server_credentials(config)  # before binding anything
    server_cfg = config.server
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    server, servicer, health_servicer = build(server_cfg, metrics)
    port = bind(server, server_cfg.host, server_cfg.port, credentials)
    if server_cfg.unix_socket:
        bind_unix(server, server_cfg.unix_socket, credentials)
    http_server = serve_metrics(server_cfg, registry)
    server.start()

    engine, ranks = build_engine(config, metrics, inference_only, restore, resume, topology)
    servicer.attach(engine)
    set_serving(health_servicer)
    running = Running(
        server, health_servicer, servicer, engine, port, http_server.server_port, ranks
    )
    log_serving(config, engine, port, running.metrics_port, credentials is not None,
                inference_only)  # fmt: skip
    return running


def stop(running: Running, grace_s: float) -> None:
    """Drain: NOT_SERVING at once, refuse new calls, finish queued ones, final checkpoint.

    The listener stays open until the queued Steps are applied, so their replies go out and a
    new call meets the servicer's UNAVAILABLE. `grace_s` bounds both: Steps not started by then
    are answered UNAVAILABLE, and what is still open after it (streams) is cancelled.
    """
    running.health.enter_graceful_shutdown()
    running.servicer.refuse_new_calls()
    logs.event(logging.INFO, "draining", grace_s=grace_s)
    started = time.monotonic()
    final = running.engine.drain(grace_s)
    running.server.stop(max(0.0, grace_s - (time.monotonic() - started))).wait()
    running.servicer.flush_logs()
    if running.ranks is not None:
        running.ranks.stop()
    if final is not None:
        logs.event(logging.INFO, "final checkpoint", name=final.name, step=final.global_step)


def tune_process(server: ServerConfig) -> None:
    """What a serving process sets for itself: one malloc arena for its many threads, freed
    heap kept for the next request (requests of a few MiB are received, decoded and copied
    per call: from the heap, not fresh mmap'd pages that fault), and the GIL's switch
    interval (`server.gil_switch_interval_ms`)."""
    limit_malloc_arenas()
    retain_freed_memory()
    sys.setswitchinterval(server.gil_switch_interval_ms / 1e3)


def serve(
    config: Config,
    inference_only: bool = False,
    restore: str | None = None,
    resume: bool = False,
    topology: Topology | None = None,
) -> int:
    """Run until SIGTERM or SIGINT, then drain and exit 0."""
    tune_process(config.server)  # before gRPC starts its threads
    logs.configure(config.server.log_level)
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    if topology is not None and topology.world_size > 1 and config.server.world_size > 1:
        raise ConfigError("server.world_size (--world-size) and TRIDENT_WORLD_SIZE: expected "
                          "one of them, got both")  # fmt: skip
    if topology is not None and topology.rank > 0:  # no gRPC here: rank 0's commands
        return serve_host_rank(config, topology)
    # One BLAS thread on NumPy, as the jobs run: the handlers, the act batcher and the Step
    # worker are threads of their own, and actors on the host need cores too.
    with single_blas_thread(resolve_name(config.train.backend)):
        return _serve_until_signalled(config, stopping, inference_only, restore, resume, topology)


def _serve_until_signalled(
    config: Config,
    stopping: threading.Event,
    inference_only: bool,
    restore: str | None,
    resume: bool,
    topology: Topology | None,
) -> int:
    limits = HandoffLimits.from_config(config.server)
    fit = limits.max_bytes // limits.sizes(config.model.obs_dim).total_bytes
    front_ends = front_end_count(config.server.front_ends, fit)
    if front_ends:
        config = with_overrides(config, [f"server.front_ends={front_ends}"])
        return _serve_split(config, stopping, inference_only, restore, resume, topology)
    running = start(config, inference_only, restore, resume, topology)
    _wait(stopping)
    stop(running, config.server.shutdown_grace_s)
    return 0


def _serve_split(
    config: Config,
    stopping: threading.Event,
    inference_only: bool,
    restore: str | None,
    resume: bool,
    topology: Topology | None,
) -> int:
    """`server.front_ends` processes in front of this one (`server.split`); exit 1, saying
    why, where the front ends cannot stay up."""
    why: list[str] = []

    def failed(reason: str) -> None:
        why.append(reason)
        stopping.set()

    running = split.start(config, failed, inference_only, restore, resume, topology)
    _wait(stopping)
    if why:
        logs.event(logging.ERROR, "stopping", reason=why[0])
    split.stop(running, config.server.shutdown_grace_s)
    return 1 if why else 0


def _wait(stopping: threading.Event) -> None:
    # Python runs a signal's handler on the main thread once that thread executes bytecode; a
    # signal that lands on another thread (CUDA's runtime starts several) does not wake a wait
    # without a timeout, so the wait wakes up to look.
    while not stopping.wait(SIGNAL_POLL_S):
        pass
