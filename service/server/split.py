"""`trident serve` with server.front_ends >= 1: the learner process in front of N front-end
processes (`server.front_end`), and its drain.

The learner process owns the device, the batched Act, the Step queue and the checkpoints
(`Engine`); it serves the front ends over a handoff `Hub` on a Unix socket in a folder only
this user reads (`LearnerHub`), reserves the public port for them, starts them
(`FrontEnds`) and says "serving" once each of them serves. It owns the admission bounds'
counts for the whole server (`shared_admission`), and its metrics page is the whole server's
(`server_metrics`).

SIGTERM drains in order: the front ends stop taking calls (NOT_SERVING, new calls UNAVAILABLE)
while the learner applies the queued Steps and answers the Acts pending (their answers still
reach the front ends' callers), commits a final checkpoint, and the front ends finish their
calls within the grace and exit; then the hub closes.
"""

from __future__ import annotations

import json
import logging
import shutil
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry

from service import logs
from service.backend.rendezvous import Topology
from service.config import Config
from service.errors import InvalidInput
from service.handoff import HandoffLimits
from service.server import learner_calls as calls
from service.server.engine import Engine
from service.server.front_ends import FrontEnds, private_dir, reserve_port
from service.server.grpc_server import server_credentials
from service.server.learner_hub import LearnerHub
from service.server.learner_process import (
    build_engine,
    checked_start,
    log_serving,
    serve_metrics,
)
from service.server.metrics import Metrics
from service.server.ranks import Ranks
from service.server.server_metrics import ServerWide
from service.server.shared_admission import AdmissionCounts

# answered on the hub's reader thread: a count, a dict's entry
INLINE_CALLS = frozenset({calls.ADMIT, calls.LEAVE, calls.METRICS})
ADMISSION_CALLS = frozenset({calls.ADMIT, calls.LEAVE})
STARTUP_TIMEOUT_S = 120.0  # the front ends' start, each a Python process importing gRPC
EXIT_SLACK_S = 5.0  # past the grace, what a front end gets to exit before it is killed


@dataclass
class Split:
    """A started learner process and its front ends."""

    engine: Engine
    hub: LearnerHub
    front_ends: FrontEnds
    reserved: socket.socket
    folder: str
    port: int
    metrics_port: int
    http_server: WSGIServer
    ranks: Ranks | None = None


def start(
    config: Config,
    failed: Callable[[str], None],
    inference_only: bool = False,
    restore: str | None = None,
    resume: bool = False,
    topology: Topology | None = None,
) -> Split:
    """Build the engine, start the front ends, and say "serving" once each serves.
    `failed(why)` is told when the front ends cannot stay up (the server should stop)."""
    config = checked_start(config, inference_only, restore, resume)
    server_cfg = config.server
    server_credentials(config)  # a bad PEM file is named here, before anything starts
    reserved = reserve_port(server_cfg.host, server_cfg.port)
    port = reserved.getsockname()[1]
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    server_wide = ServerWide(registry)
    page = CollectorRegistry()
    page.register(server_wide)
    http_server = serve_metrics(server_cfg, page)
    engine, ranks = build_engine(config, metrics, inference_only, restore, resume, topology)
    folder = private_dir()
    # the learner's model and training settings (a restored checkpoint's), this server's own
    settings = {**engine.config.to_dict(), "server": config.to_dict()["server"]}
    handoff = str(Path(folder, "handoff.sock"))

    def command(index: int) -> list[str]:
        return [sys.executable, "-m", "service.server.front_end", "--handoff", handoff,
                "--port", str(port), "--index", str(index)]  # fmt: skip

    front_ends = FrontEnds(server_cfg.front_ends, command, json.dumps(settings).encode(),
                           metrics.front_end_restarts.inc, failed)  # fmt: skip

    admission = AdmissionCounts(server_cfg)

    def on_call(front_end: int, name: str, args: Any) -> Any:
        if name in ADMISSION_CALLS:
            return admission.answer(front_end, name, args)
        if name == calls.READY:
            front_ends.ready(args["pid"], args["index"])
            return None
        if name == calls.METRICS:
            server_wide.update(front_end, args["families"], args.get("number", 0))
            return None
        raise InvalidInput("handoff.call", "a call the learner answers", repr(name))

    def gone(front_end: int) -> None:
        admission.gone(front_end)
        server_wide.gone(front_end)

    hub = LearnerHub(engine, HandoffLimits.from_config(server_cfg), server_cfg.front_ends,
                     on_call, inline=INLINE_CALLS, on_gone=gone)  # fmt: skip
    server_wide.ask = hub.hub.ask
    hub.listen(handoff)
    split = Split(engine, hub, front_ends, reserved, folder, port, http_server.server_port,
                  http_server, ranks)  # fmt: skip
    try:
        pids = front_ends.start(STARTUP_TIMEOUT_S)
    except BaseException:
        front_ends.terminate()
        front_ends.wait(EXIT_SLACK_S)
        _close(split)
        raise
    log_serving(config, engine, port, split.metrics_port, bool(server_cfg.tls_cert),
                inference_only, front_ends=pids)  # fmt: skip
    return split


def stop(split: Split, grace_s: float) -> None:
    """Drain (module doc): the front ends first stop taking calls, the learner applies what is
    queued and commits its final checkpoint, then everything exits."""
    split.front_ends.terminate()
    logs.event(logging.INFO, "draining", grace_s=grace_s)
    started = time.monotonic()
    final = split.engine.drain(grace_s)
    split.front_ends.wait(max(0.0, grace_s - (time.monotonic() - started)) + EXIT_SLACK_S)
    _close(split)
    if split.ranks is not None:
        split.ranks.stop()
    if final is not None:
        logs.event(logging.INFO, "final checkpoint", name=final.name, step=final.global_step)


def _close(split: Split) -> None:
    split.hub.close()
    split.reserved.close()
    split.http_server.shutdown()
    split.http_server.server_close()
    shutil.rmtree(split.folder, ignore_errors=True)
