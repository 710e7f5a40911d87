"""Admission: each kind of call has a bound of its own, so data traffic never crowds out a
health check or an operator's call, and a stream whose client went quiet is ended.

gRPC's own `maximum_concurrent_rpcs` counts every call alike: 64 idle Interact streams made a
liveness probe fail. Here the interceptor sorts calls by method:

- data streams (Interact, StreamStep): at most `server.max_streams` open;
- data calls (Step, Act): at most `server.max_concurrent_rpcs` in flight;
- control (GetStatus, Checkpoint, ListCheckpoints, Restore, UpdateHyperparams, health Watch,
  reflection): at most `server.max_control_rpcs`;
- health Check: unbounded (it returns at once), on threads of its own (`HEALTH_THREADS`).

The handler pool has a thread for every call the bounds admit plus `HEALTH_THREADS`
(`handler_threads`), so no mix of admitted calls leaves a health check without one. A call past
its bound is answered RESOURCE_EXHAUSTED naming the setting, counted in
`trident_rpcs_limited_total{method, limit}` (and `trident_rpc_errors_total`) and logged: the
first refusal of each limit, then the count at most every `LOG_EVERY_S`.

A data stream waiting on its client (in its next request, or in a reply the client has not
read) for `server.stream_idle_s` is cancelled by one watcher thread; the handler sees its request
iterator fail, the stream's thread and its seat at the Step queue go back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from service import logs
from service.config import ServerConfig
from service.errors import Abandoned

TRAINER = "/trident.v1.TrainerService/"
DATA_STREAMS = frozenset(TRAINER + name for name in ("Interact", "StreamStep"))
DATA_CALLS = frozenset(TRAINER + name for name in ("Step", "Act"))
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
HEALTH_THREADS = 4  # handler threads beyond every bound's calls: health checks always find one
LOG_EVERY_S = 10.0  # after a limit's first refusal, its count is logged at most this often

Clock = Callable[[], float]


def handler_threads(server: ServerConfig) -> int:
    """The handler pool's size: a thread for every call the bounds admit, plus HEALTH_THREADS
    (a refused call holds one for the moment it takes to answer)."""
    return (server.max_streams + server.max_concurrent_rpcs + server.max_control_rpcs
            + HEALTH_THREADS)  # fmt: skip


class Bound:
    """At most `value` calls at once of one kind; refusals counted and logged."""

    def __init__(
        self,
        setting: str,
        value: int,
        refused: Callable[[str, str], None],
        clock: Clock = time.monotonic,
    ) -> None:
        self.setting, self.value, self.refused, self.clock = setting, value, refused, clock
        self.open = 0
        self._lock = threading.Lock()
        self._unlogged = 0  # refusals since the last log line
        self._logged_at: float | None = None

    def enter(self) -> bool:
        with self._lock:
            if self.open >= self.value:
                return False
            self.open += 1
            return True

    def leave(self) -> None:
        with self._lock:
            self.open -= 1

    def refuse(self, method: str, context: grpc.ServicerContext) -> None:
        """Answer RESOURCE_EXHAUSTED naming the setting (raises, as `abort` does)."""
        name = method.rsplit("/", 1)[-1]
        message = (f"{self.setting} = {self.value}: that many {name} calls of its kind are open "
                   "already; retry with backoff")  # fmt: skip
        self.refused(name, self.setting)
        now = self.clock()
        with self._lock:
            self._unlogged += 1
            due = self._logged_at is None or now - self._logged_at >= LOG_EVERY_S
            if due:
                count, self._unlogged, self._logged_at = self._unlogged, 0, now
        if due:
            logs.event(logging.WARNING, "calls refused", limit=self.setting, value=self.value,
                       method=name, refused=count,
                       later=f"counted; logged again at most every {LOG_EVERY_S:g} s")  # fmt: skip
        context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, message)


class _Watched:
    """One data stream's wait on its client: since when (None: the server is working)."""

    __slots__ = ("context", "ended", "method", "since")

    def __init__(self, context: grpc.ServicerContext, method: str) -> None:
        self.context, self.method = context, method
        self.since: float | None = None
        self.ended = False


class IdleStreams:
    """Ends the data streams that have waited on their client for `idle_s`: one thread looks
    every `idle_s / 4` (at most 1 s), so a stream ends within 1.25 x idle_s of going quiet."""

    def __init__(
        self, idle_s: float, ended: Callable[[str, str], None], clock: Clock = time.monotonic
    ) -> None:
        self.idle_s, self.ended, self.clock = idle_s, ended, clock
        self._open: set[_Watched] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def watch(self, method: str, behavior: Callable[..., Iterator[Any]], requests: Any,
              context: grpc.ServicerContext) -> Iterator[Any]:  # fmt: skip
        """`behavior(requests, context)`'s replies, the waits on the client timed."""
        watched = _Watched(context, method)
        with self._lock:
            self._open.add(watched)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="idle-streams",
                                                daemon=True)  # fmt: skip
                self._thread.start()
        try:
            for reply in behavior(self._requests(requests, watched), context):
                watched.since = self.clock()  # until the client has read it
                yield reply
                watched.since = None
        finally:
            with self._lock:
                self._open.discard(watched)

    def _requests(self, requests: Iterator[Any], watched: _Watched) -> Iterator[Any]:
        while True:
            watched.since = self.clock()
            try:
                request = next(requests)
            except StopIteration:
                return
            except grpc.RpcError:
                if watched.ended:  # the handler's error names why, not "internal error"
                    raise Abandoned(f"no request from the client for server.stream_idle_s = "
                                    f"{self.idle_s:g} s; the stream was ended") from None
                raise
            finally:
                watched.since = None
            yield request

    def _run(self) -> None:
        while True:
            time.sleep(min(1.0, self.idle_s / 4))
            now = self.clock()
            with self._lock:
                quiet = [w for w in self._open
                         if not w.ended and w.since is not None and now - w.since > self.idle_s]
            for watched in quiet:  # fmt: skip
                watched.ended = True
                name = watched.method.rsplit("/", 1)[-1]
                self.ended(name, "server.stream_idle_s")
                logs.event(logging.WARNING, "idle stream ended", method=name,
                           idle_s=round(now - (watched.since or now), 1),
                           limit="server.stream_idle_s", value=self.idle_s)  # fmt: skip
                watched.context.cancel()


class AdmissionInterceptor(grpc.ServerInterceptor):
    """Sorts each call into its bound (module doc) and wraps its handler to enter and leave it;
    data streams are also watched for idleness. `limited(method, setting)` counts each call
    refused by a bound, `ended_idle(method, setting)` each stream ended for idleness."""

    def __init__(
        self,
        server: ServerConfig,
        limited: Callable[[str, str], None],
        ended_idle: Callable[[str, str], None],
        clock: Clock = time.monotonic,
    ) -> None:
        self.streams = Bound("server.max_streams", server.max_streams, limited, clock)
        self.calls = Bound("server.max_concurrent_rpcs", server.max_concurrent_rpcs, limited,
                           clock)  # fmt: skip
        self.control = Bound("server.max_control_rpcs", server.max_control_rpcs, limited, clock)
        self.idle = IdleStreams(server.stream_idle_s, ended_idle, clock)

    def bound_of(self, method: str) -> Bound | None:
        if method in DATA_STREAMS:
            return self.streams
        if method in DATA_CALLS:
            return self.calls
        if method == HEALTH_CHECK:
            return None
        return self.control

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        method = handler_call_details.method
        bound = self.bound_of(method)
        if handler is None or bound is None:
            return handler
        # The bound is entered on the handler's thread, not here (gRPC's polling thread): a
        # call cancelled before its handler runs then never holds a place.
        kwargs = {"request_deserializer": handler.request_deserializer,
                  "response_serializer": handler.response_serializer}  # fmt: skip
        if handler.response_streaming:
            behavior = handler.stream_stream or handler.unary_stream
            watch = method in DATA_STREAMS

            def streaming(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                if not bound.enter():
                    bound.refuse(method, context)
                try:
                    if watch:
                        yield from self.idle.watch(method, behavior, request, context)
                    else:
                        yield from behavior(request, context)
                finally:
                    bound.leave()

            make = (grpc.stream_stream_rpc_method_handler if handler.request_streaming
                    else grpc.unary_stream_rpc_method_handler)  # fmt: skip
            return make(streaming, **kwargs)
        behavior = handler.stream_unary or handler.unary_unary

        def unary(request: Any, context: grpc.ServicerContext) -> Any:
            if not bound.enter():
                bound.refuse(method, context)
            try:
                return behavior(request, context)
            finally:
                bound.leave()

        make = (grpc.stream_unary_rpc_method_handler if handler.request_streaming
                else grpc.unary_unary_rpc_method_handler)  # fmt: skip
        return make(unary, **kwargs)
