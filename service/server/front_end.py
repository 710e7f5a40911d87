"""A front-end process (`python -m service.server.front_end`): the gRPC server on the public port
beside its siblings, in front of the learner process it reaches over the handoff.

It terminates gRPC, authenticates, validates and decodes, and assembles its Interact streams'
rollouts; the servicer runs unchanged over `LearnerProxy`. The learner process starts it with
its settings on its stdin (they hold the token: never on disk) and a handoff socket to connect
to; it tells the learner it serves (`ready`) once its server has started. Its admission bounds
are the whole server's (`shared_admission`) and its own metrics (calls refused and failed,
streams open) go to the learner's page (`server_metrics`). SIGTERM drains it: NOT_SERVING, new
calls refused UNAVAILABLE, calls in flight finished within server.shutdown_grace_s. When the
learner's end of the handoff closes, it stops at once (exit 1): there is no learner to serve.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time

from prometheus_client import CollectorRegistry

from service import logs
from service.config import Config, ConfigError
from service.errors import TridentError
from service.handoff import Handoff, HandoffLimits
from service.server import learner_calls as calls
from service.server.admission import Bound
from service.server.grpc_server import (
    bind,
    bind_unix,
    build,
    server_credentials,
    set_serving,
)
from service.server.learner_proxy import LearnerProxy
from service.server.metrics import Metrics
from service.server.server_metrics import answer_asks, push_metrics
from service.server.shared_admission import RemoteBound

POLL_S = 0.25  # how often the main thread looks for a signal or a closed handoff


def run(config: Config, handoff_path: str, port: int, index: int) -> int:
    """Serve until SIGTERM (drain, exit 0) or the learner's end closing (exit 1)."""
    server_cfg = config.server
    sys.setswitchinterval(server_cfg.gil_switch_interval_ms / 1e3)
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    credentials = server_credentials(config)
    sizes = HandoffLimits.from_config(server_cfg).sizes(config.model.obs_dim)
    handoff = Handoff.connect(handoff_path, sizes)

    def bound(setting: str, value: int) -> Bound:  # the server's places, not this process's
        return RemoteBound(setting, value, metrics.refused, handoff, time.monotonic)

    server, servicer, health = build(server_cfg, metrics, reuse_port=True, bounds=bound)
    bind(server, server_cfg.host, port, credentials)
    if server_cfg.unix_socket and index == 0:  # a Unix socket has one listener: the first's
        bind_unix(server, server_cfg.unix_socket, credentials)
    servicer.attach(LearnerProxy(handoff, config.to_dict()["server"]))
    server.start()
    set_serving(health)
    answer_asks(registry, handoff)
    handoff.call(calls.READY, {"pid": os.getpid(), "index": index})
    pushed = threading.Event()
    pusher = threading.Thread(target=push_metrics, args=(registry, handoff, pushed),
                              name="trident-metrics-push", daemon=True)  # fmt: skip
    pusher.start()
    while not stopping.wait(POLL_S):
        if not handoff.up:
            logs.event(logging.ERROR, "front end: the learner process is gone; stopping",
                       index=index)  # fmt: skip
            server.stop(0).wait(5)
            return 1
    health.enter_graceful_shutdown()
    servicer.refuse_new_calls()
    server.stop(server_cfg.shutdown_grace_s).wait()
    servicer.flush_logs()
    pushed.set()  # the last snapshot, with the drain's counts
    pusher.join()
    handoff.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m service.server.front_end")
    parser.add_argument("--handoff", required=True, help="the learner's handoff socket")
    parser.add_argument("--port", type=int, required=True, help="the public port, reserved")
    parser.add_argument("--index", type=int, required=True, help="this front end's place")
    args = parser.parse_args(argv)
    config = Config.from_dict(json.loads(sys.stdin.buffer.read()))  # the learner's pipe
    # its lines share the learner's stderr: each says which front end wrote it
    logs.configure(config.server.log_level, front_end=args.index, pid=os.getpid())
    try:
        return run(config, args.handoff, args.port, args.index)
    except (ConfigError, TridentError) as error:  # a bind, TLS or handoff refusal: said once
        print(f"trident: error: front end {args.index}: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
