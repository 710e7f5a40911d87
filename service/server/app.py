"""`trident serve`: build the gRPC server in front of the learner (`Engine`), run it, drain it on
SIGTERM."""

from __future__ import annotations

import logging
import os
import signal
import socket
import ssl
import sys
import tempfile
import threading
import time
from concurrent import futures
from dataclasses import dataclass
from errno import EACCES, EADDRINUSE, EADDRNOTAVAIL
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry, start_http_server

from service import logs
from service.api.trident.v1 import trainer_pb2 as pb
from service.backend import resolve_name
from service.backend.blas import single_blas_thread
from service.backend.host_memory import limit_malloc_arenas, retain_freed_memory
from service.backend.rendezvous import Topology
from service.config import (
    SERVE_CHECKPOINT_DIR,
    Config,
    ConfigError,
    ServerConfig,
    with_checkpoint_dir,
)
from service.server.admission import AdmissionInterceptor, handler_threads
from service.server.auth import BearerTokenInterceptor, TokenTable
from service.server.engine import Engine
from service.server.metrics import Metrics
from service.server.ranks import RankedTrainer, Ranks, serve_host_rank, start_ranks
from service.server.reflection import enable_reflection
from service.server.servicer import TrainerServicer, method_handlers

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["TrainerService"].full_name
SIGNAL_POLL_S = 0.5  # how often the main thread looks for a SIGTERM / SIGINT to drain on


def _read(setting: str, path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise ConfigError(f"{setting} = {path!r}: expected a readable PEM file ({error})") from None


def _check_pem(config: Config) -> None:
    """Parse the PEM files the way a TLS stack will, so a bad one is named before binding."""
    server = config.server
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(server.tls_cert, server.tls_key)
    except (ssl.SSLError, ValueError) as error:
        raise ConfigError(
            f"server.tls_cert = {server.tls_cert!r} / server.tls_key = {server.tls_key!r}: "
            f"expected a PEM certificate and its matching private key ({error})"
        ) from None
    if server.tls_client_ca:
        try:
            context.load_verify_locations(server.tls_client_ca)
        except (ssl.SSLError, ValueError) as error:
            raise ConfigError(
                f"server.tls_client_ca = {server.tls_client_ca!r}: expected PEM CA "
                f"certificates ({error})"
            ) from None


def server_credentials(config: Config) -> grpc.ServerCredentials | None:
    """TLS (and mTLS when a client CA is set) credentials, or None for plaintext."""
    server = config.server
    if not server.tls_cert:
        return None
    pair = (_read("server.tls_key", server.tls_key), _read("server.tls_cert", server.tls_cert))
    client_ca = None
    if server.tls_client_ca:
        client_ca = _read("server.tls_client_ca", server.tls_client_ca)
    _check_pem(config)
    return grpc.ssl_server_credentials(
        [pair], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


def _bind(
    server: grpc.Server, host: str, port: int, credentials: grpc.ServerCredentials | None
) -> int:
    """Listen on host:port and return the port bound, or raise one ConfigError naming the
    settings, their flags and the OS's reason. gRPC core logs a failed bind on stderr before it
    raises; that line says nothing the error does not, so it is held back (on success, whatever
    core wrote is passed on)."""
    address = f"{host}:{port}"
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            bound = _add_port(server, address, credentials)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        held.seek(0)
        logged = held.read()
    if not bound:
        # core's line quotes the OS's reason (strerror) for the failed bind
        reasons = [os.strerror(code) for code in (EADDRINUSE, EADDRNOTAVAIL, EACCES)]
        reason = next((r for r in reasons if r.encode() in logged), "gRPC could not bind it")
        raise ConfigError(
            f"server.host:server.port = {address} (--host, --port): {reason}; expected a free "
            "address to bind (stop what holds the port, or pick another --port; 0 picks a free "
            "one)"
        )
    os.write(2, logged)
    return bound


def _add_port(
    server: grpc.Server, address: str, credentials: grpc.ServerCredentials | None
) -> int:
    """Listen on `address`, with TLS when `credentials`; the port bound, 0 when gRPC could not."""
    try:
        if credentials is None:
            return server.add_insecure_port(address)
        return server.add_secure_port(address, credentials)
    except RuntimeError:
        return 0


def _bind_unix(
    server: grpc.Server, path: str, credentials: grpc.ServerCredentials | None
) -> None:
    """Listen on the Unix-domain socket `path` too; a socket file left by a server that is gone
    is replaced, anything else there (a file, a server still listening) is an error naming the
    setting."""
    where = Path(path)
    setting = f"server.unix_socket = {path!r} (--unix-socket)"
    if where.exists() or where.is_symlink():
        if not where.is_socket():
            raise ConfigError(f"{setting}: expected a free path or a stale socket, got an "
                              "existing file")  # fmt: skip
        with socket.socket(socket.AF_UNIX) as probe:
            if probe.connect_ex(str(where)) == 0:
                raise ConfigError(f"{setting}: a server is listening there; expected a free "
                                  "path (stop it, or pick another --unix-socket)")  # fmt: skip
        where.unlink()
    if not _add_port(server, f"unix:{where}", credentials):
        raise ConfigError(f"{setting}: gRPC could not listen there; expected a path in a "
                          "writable folder")  # fmt: skip


def connection_options(server: ServerConfig) -> list[tuple[str, int]]:
    """gRPC core's connection limits: keepalive pings end a connection whose peer vanished
    within server.keepalive_s + server.keepalive_timeout_s, and one with no call for
    server.connection_idle_s is closed."""
    return [
        ("grpc.keepalive_time_ms", round(server.keepalive_s * 1000)),
        ("grpc.keepalive_timeout_ms", round(server.keepalive_timeout_s * 1000)),
        # pings go on while a stream sends nothing (core's default stops after 2): a silent
        # stream's dead peer is what they are for
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.max_connection_idle_ms", round(server.connection_idle_s * 1000)),
    ]


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
    if inference_only and restore is None:
        raise ConfigError("--inference-only: expected --restore NAME, got none")
    if resume and (restore is not None or inference_only):
        raise ConfigError("--resume: restores the newest checkpoint of a training server; "
                          "expected neither --restore nor --inference-only with it")
    config = with_checkpoint_dir(config, SERVE_CHECKPOINT_DIR.format(port=config.server.port))
    credentials = server_credentials(config)  # before binding anything
    server_cfg = config.server
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    tokens = TokenTable.of(server_cfg)  # a malformed token file stops start-up here
    # Admission is Trident's (service/server/admission.py), per kind of call: gRPC's own
    # maximum_concurrent_rpcs would count health checks and idle streams alike. It comes first
    # so that the calls the token check refuses are bounded too.
    interceptors: list[grpc.ServerInterceptor] = [
        AdmissionInterceptor(server_cfg, metrics.refused, metrics.ended_waiting)
    ]
    if tokens is not None:
        interceptors.append(BearerTokenInterceptor(tokens, metrics.rpc_error))
    limit = server_cfg.max_message_mb * 1024 * 1024
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=handler_threads(server_cfg)),
        interceptors=interceptors,
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
            ("grpc.so_reuseport", 0),  # a port in use is an error, not a shared listener
            *connection_options(server_cfg),
        ],
    )
    servicer = TrainerServicer(metrics)
    handlers = method_handlers(servicer)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),)
    )
    server.add_registered_method_handlers(SERVICE_NAME, handlers)
    health_servicer = health.HealthServicer()
    for name in ("", SERVICE_NAME):
        health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    enable_reflection((SERVICE_NAME, health.SERVICE_NAME), server)
    port = _bind(server, server_cfg.host, server_cfg.port, credentials)
    if server_cfg.unix_socket:
        _bind_unix(server, server_cfg.unix_socket, credentials)
    try:
        http_server, _ = start_http_server(
            server_cfg.metrics_port, addr=server_cfg.host, registry=registry
        )
    except OSError as error:
        raise ConfigError(
            f"server.metrics_port = {server_cfg.metrics_port} on {server_cfg.host} "
            f"(--metrics-port): {error.strerror or error}; expected a free port (stop what holds "
            "it, or pick another --metrics-port; 0 picks a free one)"
        ) from None
    server.start()

    ranks = None
    if inference_only:
        engine = Engine.for_inference(config, restore, metrics)
    else:
        trainer, ranks = start_ranks(config, topology)
        engine = Engine(trainer if ranks is None else RankedTrainer(trainer, ranks), metrics)
        engine.start(restore, resume)
    servicer.attach(engine)
    for name in ("", SERVICE_NAME):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    running = Running(
        server, health_servicer, servicer, engine, port, http_server.server_port, ranks
    )
    logs.event(
        logging.INFO,
        "serving",
        host=server_cfg.host,
        port=port,
        unix_socket=server_cfg.unix_socket or None,
        metrics_port=running.metrics_port,
        backend=engine.trainer.backend.name,
        tls=credentials is not None,
        auth=server_cfg.client_auth(),
        inference_only=inference_only,
        checkpoint_dir=config.checkpoint.dir,
    )
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
    running = start(config, inference_only, restore, resume, topology)
    # Python runs a signal's handler on the main thread once that thread executes bytecode; a
    # signal that lands on another thread (CUDA's runtime starts several) does not wake a wait
    # without a timeout, so the wait wakes up to look.
    while not stopping.wait(SIGNAL_POLL_S):
        pass
    stop(running, config.server.shutdown_grace_s)
    return 0
