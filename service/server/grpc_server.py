"""The gRPC server of a front end, built the same way in one process (`server.app`) and in each
front-end process (`server.front_end`): interceptors (admission, then tokens), the
TrainerService's handlers, health and reflection, TLS, and binding with errors that name the
settings. Light: nothing of the learner is imported here.

A front-end process binds the public port beside its siblings (`reuse_port`: gRPC's
`grpc.so_reuseport`, the kernel spreading connections over the processes, a long stream staying
with its process); the one-process server binds it alone, so a port in use is an error.
"""

from __future__ import annotations

import os
import socket
import ssl
import sys
import tempfile
from collections.abc import Callable
from concurrent import futures
from errno import EACCES, EADDRINUSE, EADDRNOTAVAIL
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from service.api.trident.v1 import trainer_pb2 as pb
from service.config import Config, ConfigError, ServerConfig
from service.server.admission import AdmissionInterceptor, Bound, handler_threads
from service.server.auth import BearerTokenInterceptor, TokenTable
from service.server.metrics import Metrics
from service.server.reflection import enable_reflection
from service.server.servicer import TrainerServicer, method_handlers

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["TrainerService"].full_name


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


def bind(
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


def bind_unix(
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




def build(
    server_cfg: ServerConfig,
    metrics: Metrics,
    reuse_port: bool = False,
    bounds: Callable[[str, int], Bound] | None = None,
) -> tuple[grpc.Server, TrainerServicer, health.HealthServicer]:
    """The server, its TrainerService servicer (attach a learner to it) and its health
    servicer (NOT_SERVING until `set_serving`); nothing bound yet. `bounds`: the admission
    bounds' maker (`AdmissionInterceptor`), server-wide ones in a front-end process."""
    tokens = TokenTable.of(server_cfg)  # a malformed token file stops start-up here
    # Admission is Trident's (service/server/admission.py), per kind of call: gRPC's own
    # maximum_concurrent_rpcs would count health checks and idle streams alike. It comes first
    # so that the calls the token check refuses are bounded too.
    interceptors: list[grpc.ServerInterceptor] = [
        AdmissionInterceptor(server_cfg, metrics.refused, metrics.ended_waiting, bounds=bounds)
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
            # one process: a port in use is an error, not a shared listener
            ("grpc.so_reuseport", int(reuse_port)),
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
    return server, servicer, health_servicer


def set_serving(health_servicer: health.HealthServicer) -> None:
    for name in ("", SERVICE_NAME):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
