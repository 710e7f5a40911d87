"""Admission: each kind of call has a bound of its own, so data traffic never crowds out a
health check or an operator's call, and a call whose client went quiet is ended.

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
`trident_rpcs_limited_total{method, limit}` (and `trident_rpc_errors_total`) and logged
(`logs.Throttled`): the first refusal of each method, then a count every `LOG_EVERY_S` while
refusals go on.

Calls that wait on their client too long are ended by one watcher thread (`ClientWaits`): a
data stream waiting (for its next request, or for the client to read a reply) for
`server.stream_idle_s`, and any unary call whose one request has not arrived whole
`server.request_receive_s` after the call began. gRPC holds a handler thread for a unary call
from its headers on while it collects the request, with no bound of its own: a client
trickling a request byte by byte would hold that thread until its own deadline. So every
unary method is served here as a stream of one request, read under that bound; the wait's
thread and its place in its bound go back when it is ended.
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
        self.setting, self.value, self.refused = setting, value, refused
        self.open = 0
        self._lock = threading.Lock()
        self._log = logs.Throttled(LOG_EVERY_S, clock)

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
        self._log.event(logging.WARNING, "calls refused", name, limit=self.setting,
                        value=self.value, method=name)  # fmt: skip
        context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, message)


class _Watched:
    """One call's wait on its client: since when (None: the server is working), and the
    setting that bounds it."""

    __slots__ = ("context", "ended", "limit_s", "method", "setting", "since")

    def __init__(
        self, context: grpc.ServicerContext, method: str, setting: str, limit_s: float
    ) -> None:
        self.context, self.method, self.setting, self.limit_s = context, method, setting, limit_s
        self.since: float | None = None
        self.ended = False


STREAM_IDLE = "server.stream_idle_s"
REQUEST_RECEIVE = "server.request_receive_s"
_ENDED_EVENT = {STREAM_IDLE: "idle stream ended", REQUEST_RECEIVE: "request not received"}


class ClientWaits:
    """Ends the calls that have waited on their client past their bound: one thread looks every
    quarter of the shorter bound (at most every 1 s), so a call ends within 1.25 x its bound
    (or its bound + 1 s) of the wait's start."""

    def __init__(
        self,
        idle_s: float,
        receive_s: float,
        ended: Callable[[str, str], None],
        clock: Clock = time.monotonic,
    ) -> None:
        self.idle_s, self.receive_s, self.ended, self.clock = idle_s, receive_s, ended, clock
        self._open: set[_Watched] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def _open_wait(self, context: grpc.ServicerContext, method: str, setting: str,
                   limit_s: float) -> _Watched:  # fmt: skip
        watched = _Watched(context, method, setting, limit_s)
        with self._lock:
            self._open.add(watched)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="client-waits",
                                                daemon=True)  # fmt: skip
                self._thread.start()
        return watched

    def _close_wait(self, watched: _Watched) -> None:
        with self._lock:
            self._open.discard(watched)

    def request(self, method: str, requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
        """A unary call's one request, received within server.request_receive_s (a call ended
        for it, or left by its client, raises the iterator's grpc.RpcError: gRPC answers it
        CANCELLED and logs nothing)."""
        watched = self._open_wait(context, method, REQUEST_RECEIVE, self.receive_s)
        watched.since = self.clock()
        try:
            return next(requests)
        except StopIteration:
            name = method.rsplit("/", 1)[-1]
            message = f"{name} takes one request message; the call ended without one"
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)
        finally:
            self._close_wait(watched)

    def stream(self, method: str, behavior: Callable[..., Iterator[Any]], requests: Any,
               context: grpc.ServicerContext) -> Iterator[Any]:  # fmt: skip
        """`behavior(requests, context)`'s replies, its waits on the client bounded by
        server.stream_idle_s."""
        watched = self._open_wait(context, method, STREAM_IDLE, self.idle_s)
        replies = behavior(self._requests(requests, watched), context)
        try:
            for reply in replies:
                watched.since = self.clock()  # until the client has read it
                yield reply
                watched.since = None
        finally:
            # closed here, not whenever the collector gets to it: a handler counts the call
            # it was stopped in (its GeneratorExit) as it closes
            replies.close()
            self._close_wait(watched)

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
        period = min(1.0, self.idle_s / 4, self.receive_s / 4)
        while True:
            time.sleep(period)
            now = self.clock()
            with self._lock:
                late = [w for w in self._open
                        if not w.ended and w.since is not None and now - w.since > w.limit_s]
            for watched in late:  # fmt: skip
                watched.ended = True
                name = watched.method.rsplit("/", 1)[-1]
                self.ended(name, watched.setting)
                logs.event(logging.WARNING, _ENDED_EVENT[watched.setting], method=name,
                           waited_s=round(now - (watched.since or now), 1),
                           limit=watched.setting, value=watched.limit_s)  # fmt: skip
                watched.context.cancel()


class AdmissionInterceptor(grpc.ServerInterceptor):
    """Sorts each call into its bound (module doc) and wraps its handler to enter and leave it;
    its waits on the client are bounded by `ClientWaits`. `limited(method, setting)` counts each
    call refused by a bound, `ended(method, setting)` each call ended for waiting on its client.
    It must be the first interceptor, so that it also bounds the calls a later one refuses."""

    def __init__(
        self,
        server: ServerConfig,
        limited: Callable[[str, str], None],
        ended: Callable[[str, str], None],
        clock: Clock = time.monotonic,
        bounds: Callable[[str, int], Bound] | None = None,
    ) -> None:
        """`bounds(setting, value)` makes each bound (a front-end process's count the whole
        server's calls); by default, a Bound of this process's calls."""

        def local(setting: str, value: int) -> Bound:
            return Bound(setting, value, limited, clock)

        make = bounds or local
        self.streams = make("server.max_streams", server.max_streams)
        self.calls = make("server.max_concurrent_rpcs", server.max_concurrent_rpcs)
        self.control = make("server.max_control_rpcs", server.max_control_rpcs)
        self.waits = ClientWaits(server.stream_idle_s, server.request_receive_s, ended, clock)

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
        if handler is None:
            return None
        method = handler_call_details.method
        bound = self.bound_of(method)
        watch_idle = method in DATA_STREAMS
        one_request = not handler.request_streaming
        kwargs = {"request_deserializer": handler.request_deserializer,
                  "response_serializer": handler.response_serializer}  # fmt: skip

        # The bound is entered on the handler's thread, not here (gRPC's polling thread): a
        # call cancelled before its handler runs then never holds a place.
        def enter(context: grpc.ServicerContext) -> None:
            if bound is not None and not bound.enter():
                bound.refuse(method, context)

        def leave() -> None:
            if bound is not None:
                bound.leave()

        def argument(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
            return self.waits.request(method, requests, context) if one_request else requests

        if handler.response_streaming:
            behavior = handler.stream_stream or handler.unary_stream

            def streaming(requests: Iterator[Any], context: grpc.ServicerContext
                          ) -> Iterator[Any]:  # fmt: skip
                enter(context)
                try:
                    request = argument(requests, context)
                    if watch_idle:
                        yield from self.waits.stream(method, behavior, request, context)
                    else:
                        yield from behavior(request, context)
                finally:
                    leave()

            return grpc.stream_stream_rpc_method_handler(streaming, **kwargs)
        behavior = handler.stream_unary or handler.unary_unary

        def unary(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
            enter(context)
            try:
                return behavior(argument(requests, context), context)
            finally:
                leave()

        return grpc.stream_unary_rpc_method_handler(unary, **kwargs)
