"""What the learner process builds whether gRPC runs in it (`server.app`) or in front-end
processes of its own (`server.split`): the start's checks, the metrics' HTTP server, the
engine (with its ranks) and the "serving" line."""

from __future__ import annotations

import logging
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server

from service import logs
from service.backend.rendezvous import Topology
from service.config import (
    SERVE_CHECKPOINT_DIR,
    Config,
    ConfigError,
    ServerConfig,
    with_checkpoint_dir,
)
from service.server.engine import Engine
from service.server.metrics import Metrics
from service.server.ranks import RankedTrainer, Ranks, start_ranks


def checked_start(config: Config, inference_only: bool, restore: str | None, resume: bool
                  ) -> Config:  # fmt: skip
    """The start's flags checked together, and the config with the serve's checkpoint folder
    where none is set."""
    if inference_only and restore is None:
        raise ConfigError("--inference-only: expected --restore NAME, got none")
    if resume and (restore is not None or inference_only):
        raise ConfigError("--resume: restores the newest checkpoint of a training server; "
                          "expected neither --restore nor --inference-only with it")
    return with_checkpoint_dir(config, SERVE_CHECKPOINT_DIR.format(port=config.server.port))


def serve_metrics(server: ServerConfig, registry: CollectorRegistry) -> WSGIServer:
    """The metrics' HTTP server on server.metrics_port, or ConfigError naming the setting."""
    try:
        http_server, _ = start_http_server(server.metrics_port, addr=server.host,
                                           registry=registry)  # fmt: skip
    except OSError as error:
        raise ConfigError(
            f"server.metrics_port = {server.metrics_port} on {server.host} "
            f"(--metrics-port): {error.strerror or error}; expected a free port (stop what holds "
            "it, or pick another --metrics-port; 0 picks a free one)"
        ) from None
    return http_server


def build_engine(
    config: Config,
    metrics: Metrics,
    inference_only: bool,
    restore: str | None,
    resume: bool,
    topology: Topology | None,
) -> tuple[Engine, Ranks | None]:
    """The engine, started (restored or resumed), and the ranks past 0 of --world-size."""
    if inference_only:
        assert restore is not None
        return Engine.for_inference(config, restore, metrics), None
    trainer, ranks = start_ranks(config, topology)
    engine = Engine(trainer if ranks is None else RankedTrainer(trainer, ranks), metrics)
    engine.start(restore, resume)
    return engine, ranks


def log_serving(config: Config, engine: Engine, port: int, metrics_port: int, tls: bool,
                inference_only: bool, **more: Any) -> None:  # fmt: skip
    """The "serving" log line (what tests and operators wait for), with `more` fields."""
    server = config.server
    logs.event(logging.INFO, "serving", host=server.host, port=port,
               unix_socket=server.unix_socket or None, metrics_port=metrics_port,
               backend=engine.trainer.backend.name, tls=tls, auth=server.client_auth(),
               inference_only=inference_only, checkpoint_dir=config.checkpoint.dir,
               **more)  # fmt: skip
