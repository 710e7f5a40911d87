"""The learner's side of the handoff: a `Hub` that front-end processes connect to.

One selector thread reads every front end's control channel. A front end's HELLO asks for its
slots; the hub checks them against the server's limits (all front ends together included)
before it makes any shared memory, then sends the segments. An ACT hands the learner's `act`
the observations as a view into the Act slot, and the outputs are written into the same slot;
a ROLLOUT hands the learner's `step` a `Delivery` whose rollout is views into its slot. The
slot is released with the answer, once the Future the learner returned is done: the learner
must not read a Delivery's arrays after that. A SEAT message (an Interact stream's seat opens,
waits, resumes, closes) goes to the learner's `seat`; an ABANDON turns the named rollout's
`alive()` False (its caller left), as its front end's death turns all of its rollouts'.

A front end that dies (EOF on its channel, SIGKILL included) is marked gone at once, so its
queued rollouts read `alive() == False` (the Step queue's caller_waiting) and are dropped; its
segments are unmapped once nothing of its work is in the learner's hands.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import selectors
import socket
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service import logs
from service.errors import InvalidInput, OverLimit, Unavailable
from service.handoff import channel as ch
from service.handoff.channel import Channel, Kind, Message
from service.handoff.layout import ACT_OUT, RolloutShape, read_rollout
from service.handoff.limits import HandoffLimits, SlotSizes, check_rollout
from service.handoff.segment import Segment
from service.types import ActMode, ActResult, Rollout, StepResult

MODES = list(ActMode)
LINGER_RETRY_S = 0.5  # how often a reclaimed segment still viewed is tried again
SEND_TIMEOUT_S = 5.0  # a front end that reads no replies for this long is treated as gone

# What the hub calls. Each returns at once with a Future (a blocking learner call is wrapped in
# an executor by its caller); the arrays handed in are views into a slot, read until it is done.
ActFn = Callable[[np.ndarray, ActMode, float], "Future[ActResult]"]
StepFn = Callable[["Delivery"], "Future[StepResult]"]
CallFn = Callable[[int, str, Any], Any]  # (front end, name, JSON arguments) -> JSON answer
SeatFn = Callable[[int, int, ch.SeatOp, int], None]  # (front end, stream, op, columns)


@dataclass(frozen=True)
class Delivery:
    """A rollout a front end handed in. `alive()` turns False when its front end is gone."""

    front_end: int
    rollout: Rollout  # views into the slot
    stream: int  # the front end's id for the stream it came on (0: a request's)
    actor: str | None  # the idempotency key's actor id (None: an unkeyed Step)
    sequence: int
    alive: Callable[[], bool]  # False once its front end is gone or its caller left
    client: str = ""  # whose it is, as its front end names it (a request's peer)
    queued: Callable[[], None] = lambda: None  # tell the front end it has a place in the queue


@dataclass
class _FrontEnd:
    id: int
    pid: int
    channel: Channel
    sizes: SlotSizes | None = None
    act: Segment | None = None
    rollouts: Segment | None = None
    act_views: list[dict[str, np.ndarray]] = field(default_factory=list)
    busy: set[tuple[Kind, int]] = field(default_factory=set)  # slots the learner reads
    in_hand: set[int] = field(default_factory=set)  # its ROLLOUTs' request ids, until answered
    abandoned: set[int] = field(default_factory=set)  # those of in_hand whose caller left
    alive: bool = True

    def waiting(self, request: int) -> bool:
        """Whether rollout `request`'s caller still waits for it."""
        return self.alive and request not in self.abandoned

    @property
    def mapped(self) -> int:
        return 0 if self.sizes is None else self.sizes.total_bytes


@dataclass(frozen=True)
class FrontEndInfo:
    id: int
    pid: int
    alive: bool
    slots_busy: int  # Act and rollout slots the learner has not released
    mapped_bytes: int


class Hub:
    """Accepts front ends (`listen` on a Unix socket path, or `adopt` one end of a socketpair)
    and serves their Acts, rollouts and calls until `close`."""

    def __init__(
        self,
        limits: HandoffLimits,
        act: ActFn,
        step: StepFn,
        call: CallFn | None = None,
        gone: Callable[[int], None] = lambda front_end: None,
        name: str = "trident-handoff",
        seat: SeatFn | None = None,
        inline: frozenset[str] = frozenset(),
    ) -> None:
        """`gone(front_end)` is called once a front end's channel closed (its work may still
        be in the learner's hands); `seat` takes SEAT messages, and must return at once. The
        calls named in `inline` are answered on the reader thread (they must return at once:
        a count taken or given back), the rest on the call threads."""
        self.limits, self._act, self._step, self._call, self._gone = limits, act, step, call, gone
        self._seat, self._inline = seat, inline
        self.name = name
        self._lock = threading.Lock()
        self._front_ends: dict[int, _FrontEnd] = {}
        self._ids = itertools.count(1)
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._listener: socket.socket | None = None
        self._calls = ThreadPoolExecutor(4, thread_name_prefix=f"{name}-call")
        self._dropping: list[_FrontEnd] = []  # front ends that read no replies, to close
        self._lingering: list[Segment] = []  # reclaimed, unmapped once no view is left
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------------ connections
    def listen(self, path: str) -> None:
        """Accept front ends on a Unix socket at `path` (owner-only, peers of this uid only)."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listener.bind(path)
        os.chmod(path, 0o600)
        listener.listen(64)
        listener.setblocking(False)
        self._listener = listener
        self._register(listener)

    def adopt(self, sock: socket.socket) -> None:
        """Serve a front end at the other end of `sock` (a SOCK_SEQPACKET socketpair's)."""
        self._register(sock)

    def _register(self, sock: socket.socket) -> None:
        with self._lock:
            if self._closed:
                raise Unavailable("handoff: the hub is closed")
        if sock is not self._listener:
            pid, uid = ch.peer_pid(sock)
            if uid != os.getuid():
                sock.close()
                logs.event(logging.WARNING, "handoff: refused a peer of another user", uid=uid)
                return
            sock.settimeout(SEND_TIMEOUT_S)
            with self._lock:
                fe = _FrontEnd(next(self._ids), pid, Channel(sock))
                self._front_ends[fe.id] = fe
            key: Any = fe
        else:
            key = None
        self._selector.register(sock, selectors.EVENT_READ, key)
        self._wake_w.send(b"\0")

    # ----------------------------------------------------------------------------- status
    def front_ends(self) -> list[FrontEndInfo]:
        """Every front end the hub still holds (a gone one until its work is reclaimed)."""
        with self._lock:
            return [FrontEndInfo(fe.id, fe.pid, fe.alive, len(fe.busy), fe.mapped)
                    for fe in self._front_ends.values()]  # fmt: skip

    def ask(self, number: int) -> list[int]:
        """Send ASK `number` to every front end that is up; the ids of those asked."""
        with self._lock:
            up = [fe for fe in self._front_ends.values() if fe.alive and fe.sizes is not None]
        asked = []
        for fe in up:
            try:
                fe.channel.send(Kind.ASK, number)
            except OSError:  # gone: its EOF is read, or will be
                continue
            asked.append(fe.id)
        return asked

    @property
    def mapped_bytes(self) -> int:
        with self._lock:
            return sum(fe.mapped for fe in self._front_ends.values())

    def close(self) -> None:
        """Stop reading, close every channel (front ends' waiters fail at once), unmap."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._wake_w.send(b"\0")
        self._thread.join()
        self._calls.shutdown(wait=False, cancel_futures=True)
        for fe in list(self._front_ends.values()):
            self._lost(fe)
        if self._listener is not None:
            self._listener.close()
        self._wake_r.close()
        self._wake_w.close()
        self._selector.close()

    # ------------------------------------------------------------------------------- loop
    def _loop(self) -> None:
        while not self._closed:
            for key, _ in self._selector.select(LINGER_RETRY_S if self._lingering else None):
                if key.fileobj is self._wake_r:
                    self._wake_r.recv(4096)
                    with self._lock:
                        dropping, self._dropping = self._dropping, []
                    for fe in dropping:
                        self._lost(fe)
                elif key.data is None:
                    self._accept()
                else:
                    self._read(key.data)
            with self._lock:
                lingering, self._lingering = self._lingering, []
            self._unmap_segments(lingering)

    def _accept(self) -> None:
        assert self._listener is not None
        try:
            sock, _ = self._listener.accept()
        except BlockingIOError:
            return
        sock.setblocking(True)
        self._register(sock)

    def _read(self, fe: _FrontEnd) -> None:
        try:
            message = fe.channel.receive()
        except ValueError as error:
            logs.event(logging.ERROR, "handoff: a front end broke the protocol", front_end=fe.id,
                       why=str(error))  # fmt: skip
            message = None
        if message is None:
            self._lost(fe)
            return
        for fd in message.fds:  # front ends send none
            os.close(fd)
        try:
            self._dispatch(fe, message)
        except Exception as error:  # a learner call that raised at once, or a bad message
            # an answer to an ACT or a ROLLOUT gives its slot back, whatever it says
            self._fail(fe, message, error, release=message.kind in (Kind.ACT, Kind.ROLLOUT))

    def _dispatch(self, fe: _FrontEnd, message: Message) -> None:
        if message.kind is Kind.HELLO:
            self._hello(fe, message)
        elif fe.sizes is None:
            raise InvalidInput("handoff", "HELLO first", message.kind.name)
        elif message.kind is Kind.ACT:
            self._act_request(fe, message)
        elif message.kind is Kind.ROLLOUT:
            self._rollout(fe, message)
        elif message.kind is Kind.CALL:
            self._call_request(fe, message)
        elif message.kind is Kind.SEAT:
            self._seat_message(fe, message)
        elif message.kind is Kind.ABANDON:
            with self._lock:
                if message.request in fe.in_hand:
                    fe.abandoned.add(message.request)
        else:
            raise InvalidInput("handoff", "HELLO, ACT, ROLLOUT, CALL, SEAT or ABANDON",
                               message.kind.name)  # fmt: skip

    # ------------------------------------------------------------------------------ HELLO
    def _hello(self, fe: _FrontEnd, message: Message) -> None:
        protocol, obs_dim, act_slots, act_rows, rollout_slots, rollout_bytes = (
            ch.HELLO_BODY.unpack(message.body))  # fmt: skip
        if protocol != ch.PROTOCOL or fe.sizes is not None:
            raise InvalidInput("handoff", f"one HELLO of protocol {ch.PROTOCOL}", protocol)
        sizes = SlotSizes(obs_dim, act_slots, act_rows, rollout_slots, rollout_bytes)
        with self._lock:  # the check and the accounting together: front ends HELLO at once
            others = sum(other.mapped for other in self._front_ends.values())
            try:
                self.limits.check(sizes, others)
            except OverLimit as refused:
                fe.channel.send(Kind.FAILED, message.request, body=ch.error_body(refused))
                logs.event(logging.WARNING, "handoff: refused a front end's slots",
                           front_end=fe.id, pid=fe.pid, why=str(refused))  # fmt: skip
                return
            fe.sizes = sizes
        try:
            fe.act = Segment.create(f"{self.name}-act-{fe.id}", sizes.act_bytes)
            fe.rollouts = Segment.create(f"{self.name}-rollouts-{fe.id}",
                                         sizes.rollout_slots * sizes.rollout_bytes)  # fmt: skip
        except OSError:
            self._unmap(fe)
            with self._lock:
                fe.sizes = None
            raise
        layout = sizes.act_layout
        fe.act_views = [layout.views(fe.act.buffer, i * layout.nbytes, read_only=("obs",))
                        for i in range(sizes.act_slots)]  # fmt: skip
        fe.channel.send(Kind.WELCOME, message.request, body=ch.WELCOME_BODY.pack(fe.id),
                        fds=(fe.act.fd, fe.rollouts.fd))  # fmt: skip
        fe.act.close_fd()
        fe.rollouts.close_fd()
        logs.event(logging.INFO, "handoff: front end joined", front_end=fe.id, pid=fe.pid,
                   mapped_mib=round(sizes.total_bytes / 2**20, 1))  # fmt: skip

    # -------------------------------------------------------------------------------- ACT
    def _take(self, fe: _FrontEnd, kind: Kind, slot: int, slots: int) -> None:
        if not 0 <= slot < slots:
            raise InvalidInput("handoff.slot", f"a slot in [0, {slots})", slot)
        with self._lock:
            if (kind, slot) in fe.busy:
                raise InvalidInput("handoff.slot", "a slot the learner has released", slot)
            fe.busy.add((kind, slot))

    def _act_request(self, fe: _FrontEnd, message: Message) -> None:
        assert fe.sizes is not None
        rows, mode, epsilon = ch.ACT_BODY.unpack(message.body)
        if not 0 < rows <= fe.sizes.act_rows:
            raise InvalidInput("handoff.rows", f"rows in [1, {fe.sizes.act_rows}]", rows)
        self._take(fe, Kind.ACT, message.slot, fe.sizes.act_slots)
        views = fe.act_views[message.slot]
        try:
            future = self._act(views["obs"][:rows], MODES[mode], epsilon)
        except BaseException:
            self._settle(fe, Kind.ACT, message.slot)
            raise
        future.add_done_callback(lambda done: self._acted(fe, message, rows, done))

    def _acted(self, fe: _FrontEnd, message: Message, rows: int, done: Future[ActResult]) -> None:
        error = done.exception()
        if error is None:
            result = done.result()
            views = fe.act_views[message.slot]
            try:
                for name in ACT_OUT:
                    np.copyto(views[name][:rows], getattr(result, name), casting="same_kind")
            except (ValueError, TypeError) as wrong:
                error = wrong
        # settled before the reply: the front end may send the slot again as soon as it reads it
        self._settle(fe, Kind.ACT, message.slot)
        if error is not None:
            self._fail(fe, message, error, release=True)
        else:
            self._reply(fe, Kind.ACTED, message, ch.ACTED_BODY.pack(result.policy_version))

    # ---------------------------------------------------------------------------- ROLLOUT
    def _rollout(self, fe: _FrontEnd, message: Message) -> None:
        assert fe.sizes is not None and fe.rollouts is not None
        version, stream, sequence, actor_len = ch.ROLLOUT_BODY.unpack_from(message.body)
        at = ch.ROLLOUT_BODY.size + RolloutShape.PACKED.size
        shape = RolloutShape.unpack(message.body[ch.ROLLOUT_BODY.size : at])
        actor = message.body[at : at + actor_len].decode() if message.flags & ch.KEYED else None
        client = message.body[at + actor_len :].decode(errors="replace")
        layout = check_rollout(shape, fe.sizes)
        self._take(fe, Kind.ROLLOUT, message.slot, fe.sizes.rollout_slots)
        views = layout.views(fe.rollouts.buffer, message.slot * fe.sizes.rollout_bytes,
                             read_only=tuple(field.name for field in layout.fields))  # fmt: skip
        request = message.request
        with self._lock:
            fe.in_hand.add(request)
        delivery = Delivery(fe.id, read_rollout(views, None if version < 0 else version),
                            stream, actor, sequence, lambda: fe.waiting(request), client,
                            lambda: self._queued(fe, request))  # fmt: skip
        try:
            future = self._step(delivery)
        except BaseException:
            self._settle(fe, Kind.ROLLOUT, message.slot, request)
            raise
        future.add_done_callback(lambda done: self._stepped(fe, message, done))

    def _stepped(self, fe: _FrontEnd, message: Message, done: Future[StepResult]) -> None:
        error = done.exception()
        self._settle(fe, Kind.ROLLOUT, message.slot, message.request)  # before the reply
        if error is not None:
            self._fail(fe, message, error, release=True)
        else:
            self._reply(fe, Kind.STEPPED, message, ch.result_body(done.result()))

    def _queued(self, fe: _FrontEnd, request: int) -> None:
        """QUEUED for rollout `request` (from any thread; a gone front end is told nothing)."""
        if fe.alive:
            with contextlib.suppress(OSError):  # gone: its EOF is read, or will be
                fe.channel.send(Kind.QUEUED, request)

    # ------------------------------------------------------------------------------- SEAT
    def _seat_message(self, fe: _FrontEnd, message: Message) -> None:
        if self._seat is None:
            raise InvalidInput("handoff", "no SEAT (this hub takes none)", "a SEAT")
        stream, op, columns = ch.SEAT_BODY.unpack(message.body)
        try:
            self._seat(fe.id, stream, ch.SeatOp(op), columns)
        except Exception as error:  # no answer goes back: a front end's bug, said in the log
            logs.event(logging.ERROR, "handoff: a SEAT message was refused", front_end=fe.id,
                       stream=stream, op=op, why=str(error))  # fmt: skip

    # ------------------------------------------------------------------------------- CALL
    def _call_request(self, fe: _FrontEnd, message: Message) -> None:
        if self._call is None:
            raise InvalidInput("handoff", "no CALL (this hub answers none)", "a CALL")
        call, request = json.loads(message.body), self._call

        def run() -> None:
            try:
                answer = request(fe.id, call["name"], call.get("args"))
            except Exception as error:
                self._fail(fe, message, error, release=False)
                return
            self._reply(fe, Kind.ANSWER, message, ch.to_json(answer), release=False)

        if call["name"] in self._inline:
            run()
        else:
            self._calls.submit(run)

    # ------------------------------------------------------------------------ the replies
    def _reply(self, fe: _FrontEnd, kind: Kind, message: Message, body: bytes,
               release: bool = True) -> None:  # fmt: skip
        flags = ch.RELEASED if release else 0
        try:
            fe.channel.send(kind, message.request, message.slot, flags, body)
        except OSError:  # gone (its EOF is read, or will be) or not reading: it is dropped
            if fe.alive:
                logs.event(logging.WARNING, "handoff: a front end reads no replies; dropped",
                           front_end=fe.id, pid=fe.pid)  # fmt: skip
                fe.alive = False
                with self._lock:
                    self._dropping.append(fe)
                self._wake_w.send(b"\0")

    def _fail(self, fe: _FrontEnd, message: Message, error: BaseException,
              release: bool) -> None:  # fmt: skip
        self._reply(fe, Kind.FAILED, message, ch.error_body(error), release)

    def _settle(self, fe: _FrontEnd, kind: Kind, slot: int, request: int = 0) -> None:
        """The learner reads the slot (of ROLLOUT `request`) no more; a gone front end is
        reclaimed with its last."""
        with self._lock:
            fe.busy.discard((kind, slot))
            fe.in_hand.discard(request)
            fe.abandoned.discard(request)
            reclaim = not fe.alive and not fe.busy and fe.id in self._front_ends
            if reclaim:
                del self._front_ends[fe.id]
        if reclaim:
            self._unmap(fe)

    def _lost(self, fe: _FrontEnd) -> None:
        """The front end's channel closed: its queued work is abandoned, its memory reclaimed
        once the learner is done with what it holds."""
        first = fe.channel.sock.fileno() >= 0
        fe.alive = False
        if first:
            self._selector.unregister(fe.channel.sock)
            fe.channel.close()
        with self._lock:
            reclaim = not fe.busy and self._front_ends.pop(fe.id, None) is not None
        if reclaim:
            self._unmap(fe)
        if first:
            logs.event(logging.INFO, "handoff: front end gone", front_end=fe.id, pid=fe.pid,
                       in_hand=len(fe.busy))  # fmt: skip
            self._gone(fe.id)

    def _unmap(self, fe: _FrontEnd) -> None:
        fe.act_views = []
        self._unmap_segments([segment for segment in (fe.act, fe.rollouts) if segment])
        fe.act = fe.rollouts = None

    def _unmap_segments(self, segments: list[Segment]) -> None:
        """Unmap each; one a view still reads (a Delivery the learner holds on to) is tried
        again after the next event."""
        left = [segment for segment in segments if not segment.close()]
        if left:
            with self._lock:
                self._lingering.extend(left)
                wake = not self._closed and threading.current_thread() is not self._thread
            if wake:  # the loop sets its retry timer
                self._wake_w.send(b"\0")
