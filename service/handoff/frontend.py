"""A front-end process's side of the handoff: `Handoff`, which its gRPC handler threads call.

`act` writes a request's observations into a free Act slot (or `act_slot` lends one to decode
them into in place) and waits for the learner's answer in the same slot; `rollout_slot` lends a
rollout slot to write a stream's rollout in place and its `submit` hands it to the learner
(`submit_rollout` copies a whole rollout in and hands it over), answered by a Future of its
Step's result. A slot goes back to the pool only when the learner released it, so a slot is
never written while the learner reads it; with every slot of a kind in the learner's hands, a
caller waits for one (backpressure), up to its timeout.

One reader thread takes the learner's replies. When the learner's end closes (it exited or was
killed) every waiting call fails at once with Unavailable, and so does every later one.
"""

from __future__ import annotations

import itertools
import json
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np

from service.errors import InvalidInput, QueueFull, Unavailable
from service.handoff import channel as ch
from service.handoff.channel import Channel, Kind
from service.handoff.layout import ACT_OUT, RolloutShape, write_rollout
from service.handoff.limits import SlotSizes, check_act, check_rollout
from service.handoff.segment import Segment
from service.types import ActMode, ActResult, Rollout, StepResult

MODES = {mode: i for i, mode in enumerate(ActMode)}


class _Pool:
    """Free slot indices of one kind; `take` waits for one while the handoff is up."""

    def __init__(self, count: int, setting: str, what: str, lock: threading.Lock) -> None:
        self.free: deque[int] = deque(range(count))
        self.setting, self.what = setting, what
        self.wake = threading.Condition(lock)  # one a kind: a freed slot wakes a taker of its kind

    def take(self, handoff: Handoff, timeout_s: float | None) -> int:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self.wake:
            while True:
                handoff.check_up()
                if self.free:
                    return self.free.pop()  # the latest freed: its pages are warm
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise QueueFull(
                        f"handoff: every {self.what} slot is in the learner's hands "
                        f"({self.setting}); none came free in {timeout_s:g} s"
                    )
                self.wake.wait(left)

    def give(self, slot: int) -> None:
        """With the handoff's lock held."""
        self.free.append(slot)
        self.wake.notify()


class RolloutFuture(Future[StepResult]):
    """A rollout's answer from the learner: `request` names it to `Handoff.abandon`, `queued`
    is set once the learner has queued it (QUEUED, before the answer)."""

    def __init__(self, request: int = 0) -> None:
        super().__init__()
        self.request = request
        self.queued = threading.Event()


class RolloutSlot:
    """A rollout slot lent to write one rollout of `shape` in place: `arrays` are the fixed
    fields' views (obs, actions, behavior_log_probs, rewards, terminated, truncated and the
    labels the shape has); `submit` (with the final observations) or `cancel` ends the loan."""

    def __init__(self, handoff: Handoff, index: int, shape: RolloutShape) -> None:
        self.handoff, self.index, self.shape = handoff, index, shape
        self.arrays = handoff.rollout_views(index, shape)
        for name in ("final_obs", "final_obs_index"):
            del self.arrays[name]
        self.lent = True

    def submit(
        self,
        policy_version: int | None,
        final_obs: np.ndarray | None = None,
        final_obs_index: np.ndarray | None = None,
        key: tuple[str, int] | None = None,
        stream: int = 0,
        client: str = "",
    ) -> RolloutFuture:
        """Write the M final observations behind the fixed fields and hand the rollout to the
        learner (OverLimit, the slot kept, where they do not fit it)."""
        M = 0 if final_obs is None else final_obs.shape[0]
        shape = self.shape.with_final(M)
        views = self.handoff.rollout_views(self.index, shape)
        if final_obs is not None and final_obs_index is not None and M:
            np.copyto(views["final_obs"], final_obs, casting="same_kind")
            np.copyto(views["final_obs_index"], final_obs_index, casting="unsafe")
        self.lent = False
        return self.handoff.send_rollout(self.index, shape, policy_version, key, stream, client)

    def cancel(self) -> None:
        """Give the slot back unsent (a stream that ended mid-rollout)."""
        if self.lent:
            self.lent = False
            self.handoff.give_back(Kind.ROLLOUT, self.index)


class ActSlot:
    """An Act slot lent to write one request's observations in place (`obs`, [rows, D]); `run`
    or `cancel` ends the loan."""

    def __init__(self, handoff: Handoff, index: int, rows: int) -> None:
        self.handoff, self.index, self.rows = handoff, index, rows
        self.obs = handoff.act_obs(index)[:rows]
        self.lent = True

    def run(self, mode: ActMode, epsilon: float = 0.0, timeout_s: float | None = None
            ) -> ActResult:  # fmt: skip
        """The learner's answer (outputs copied out of the slot). TimeoutError past
        `timeout_s`: the slot stays in the learner's hands until it answers."""
        return self.send(mode, epsilon).result(timeout_s)

    def send(self, mode: ActMode, epsilon: float = 0.0) -> Future[ActResult]:
        """Hand the observations to the learner; its answer comes in the Future."""
        self.lent = False
        return self.handoff.send_act(self.index, self.rows, mode, epsilon)

    def cancel(self) -> None:
        """Give the slot back unsent (a request that failed its checks)."""
        if self.lent:
            self.lent = False
            self.handoff.give_back(Kind.ACT, self.index)


class Handoff:
    """A front end's connection to the learner's hub; thread-safe. Build with `connect`."""

    def __init__(self, sock: socket.socket, sizes: SlotSizes, timeout_s: float = 30.0) -> None:
        """Ask the learner (at the other end of `sock`) for `sizes`' slots and map them:
        OverLimit naming the setting when the learner's limits refuse them, Unavailable when it
        does not answer within `timeout_s`."""
        self.sizes = sizes
        self._channel = Channel(sock)
        self._lock = threading.Lock()  # the pools' and the pending calls'
        self._pending: dict[int, tuple[Future[Any], Kind, int, int]] = {}  # id -> (, slot, rows)
        self._ids = itertools.count(1)
        self._error: Exception | None = None
        self._closing = False
        self._on_ask: Callable[[int], None] = lambda number: None
        body = ch.HELLO_BODY.pack(ch.PROTOCOL, sizes.obs_dim, sizes.act_slots, sizes.act_rows,
                                  sizes.rollout_slots, sizes.rollout_bytes)  # fmt: skip
        sock.settimeout(timeout_s)
        try:
            self._channel.send(Kind.HELLO, body=body)
            welcome = self._channel.receive()
        except TimeoutError:
            self._channel.close()
            raise Unavailable(f"handoff: the learner did not answer in {timeout_s:g} s") from None
        sock.settimeout(None)
        if welcome is None or welcome.kind is not Kind.WELCOME:
            self._channel.close()
            if welcome is not None and welcome.kind is Kind.FAILED:
                raise ch.error_from(welcome.body)
            raise Unavailable("handoff: the learner closed the connection before its WELCOME")
        (self.id,) = ch.WELCOME_BODY.unpack(welcome.body)
        act_fd, rollout_fd = welcome.fds
        self._act = Segment(act_fd, sizes.act_bytes)
        self._rollouts = Segment(rollout_fd, sizes.rollout_slots * sizes.rollout_bytes)
        self._act.close_fd()
        self._rollouts.close_fd()
        layout = sizes.act_layout
        self._act_views = [layout.views(self._act.buffer, i * layout.nbytes)
                           for i in range(sizes.act_slots)]  # fmt: skip
        self._pools = {
            Kind.ACT: _Pool(sizes.act_slots, "server.handoff_act_slots", "Act", self._lock),
            Kind.ROLLOUT: _Pool(sizes.rollout_slots, "server.handoff_rollout_slots", "rollout",
                                self._lock),
        }  # fmt: skip
        self._reader = threading.Thread(target=self._read, name="trident-handoff", daemon=True)
        self._reader.start()

    @classmethod
    def connect(cls, path: str, sizes: SlotSizes, timeout_s: float = 30.0) -> Handoff:
        """Connect to a hub listening at `path` (Hub.listen)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            sock.connect(path)
        except OSError as error:
            sock.close()
            raise Unavailable(f"handoff: no learner at {path}: {error}") from None
        return cls(sock, sizes, timeout_s)

    # ------------------------------------------------------------------------------ state
    @property
    def up(self) -> bool:
        return self._error is None

    def check_up(self) -> None:
        """Unavailable once the learner's end has closed."""
        if self._error is not None:
            raise Unavailable(str(self._error))

    def slots_free(self) -> dict[str, int]:
        with self._lock:
            return {kind.name.lower(): len(pool.free) for kind, pool in self._pools.items()}

    def close(self) -> None:
        """Close the channel; waiting calls fail, the slots are unmapped with their last view."""
        self._closing = True
        self._channel.close()
        self._reader.join()
        self._act_views = []
        self._act.close()
        self._rollouts.close()

    # -------------------------------------------------------------------------------- Act
    def act(self, obs: np.ndarray, mode: ActMode, epsilon: float = 0.0,
            timeout_s: float | None = None) -> ActResult:  # fmt: skip
        """The learner's batched Act for `obs` [rows, D] (`submit_act`), waited for."""
        return self.submit_act(obs, mode, epsilon, timeout_s).result(timeout_s)

    def submit_act(self, obs: np.ndarray, mode: ActMode, epsilon: float = 0.0,
                   timeout_s: float | None = None) -> Future[ActResult]:  # fmt: skip
        """`obs` [rows, D] copied into an Act slot (`act_slot`, waiting up to `timeout_s` for
        one) and handed to the learner; its answer comes in the Future."""
        if obs.ndim != 2 or obs.shape[1] != self.sizes.obs_dim:
            raise InvalidInput("obs", f"[rows, {self.sizes.obs_dim}]", list(obs.shape))
        slot = self.act_slot(obs.shape[0], timeout_s)
        try:
            np.copyto(slot.obs, obs, casting="same_kind")
        except BaseException:
            slot.cancel()
            raise
        return slot.send(mode, epsilon)

    def act_slot(self, rows: int, timeout_s: float | None = None) -> ActSlot:
        """A free Act slot lent for `rows` observations, to write in place (a request's decode),
        waiting up to `timeout_s` for one; OverLimit past server.handoff_act_rows."""
        check_act(rows, self.sizes)
        return ActSlot(self, self._pools[Kind.ACT].take(self, timeout_s), rows)

    def send_act(self, slot: int, rows: int, mode: ActMode, epsilon: float) -> Future[ActResult]:
        """Hand the observations written in `slot` to the learner."""
        future: Future[ActResult] = Future()
        request = self._track(future, Kind.ACT, slot, rows)
        self._send(Kind.ACT, request, slot, body=ch.ACT_BODY.pack(rows, MODES[mode], epsilon))
        return future

    # --------------------------------------------------------------------------- rollouts
    def rollout_slot(self, shape: RolloutShape, timeout_s: float | None = None) -> RolloutSlot:
        """A free rollout slot for a rollout of `shape` (its final observations aside),
        waiting up to `timeout_s` for one; OverLimit where the shape does not fit a slot."""
        check_rollout(shape, self.sizes)
        return RolloutSlot(self, self._pools[Kind.ROLLOUT].take(self, timeout_s), shape)

    def submit_rollout(
        self,
        rollout: Rollout,
        key: tuple[str, int] | None = None,
        stream: int = 0,
        timeout_s: float | None = None,
        client: str = "",
    ) -> RolloutFuture:
        """Copy a whole (validated) rollout into a free slot and hand it to the learner;
        `client` names whose it is, for the learner's turns (a request's peer)."""
        shape = RolloutShape.of(rollout)
        check_rollout(shape, self.sizes)
        slot = self._pools[Kind.ROLLOUT].take(self, timeout_s)
        try:
            write_rollout(self.rollout_views(slot, shape), rollout)
        except BaseException:
            self.give_back(Kind.ROLLOUT, slot)
            raise
        return self.send_rollout(slot, shape, rollout.policy_version, key, stream, client)

    def act_obs(self, slot: int) -> np.ndarray:
        return self._act_views[slot]["obs"]

    def rollout_views(self, slot: int, shape: RolloutShape) -> dict[str, np.ndarray]:
        return check_rollout(shape, self.sizes).views(
            self._rollouts.buffer, slot * self.sizes.rollout_bytes
        )

    def send_rollout(self, slot: int, shape: RolloutShape, policy_version: int | None,
                     key: tuple[str, int] | None, stream: int, client: str = ""
                     ) -> RolloutFuture:  # fmt: skip
        """Hand the rollout written in `slot` to the learner."""
        actor, sequence = key if key is not None else ("", 0)
        actor_bytes = actor.encode()
        body = (ch.ROLLOUT_BODY.pack(-1 if policy_version is None else policy_version, stream,
                                     sequence, len(actor_bytes))
                + shape.pack() + actor_bytes + client.encode()[: ch.MAX_CLIENT])  # fmt: skip
        future = RolloutFuture()
        future.request = request = self._track(future, Kind.ROLLOUT, slot, 0)
        self._send(Kind.ROLLOUT, request, slot, ch.KEYED if key is not None else 0, body)
        return future

    def abandon(self, request: int) -> None:
        """The caller of rollout `request` left: the learner drops it unless its Step started
        (the answer still comes, an Abandoned error, and frees the slot)."""
        self._send(Kind.ABANDON, request)

    # ------------------------------------------------------------------------------ seats
    def seat(self, stream: int, op: ch.SeatOp, columns: int = 0) -> None:
        """Tell the learner of stream `stream`'s seat (SEAT; no answer)."""
        self.check_up()
        self._send(Kind.SEAT, 0, body=ch.SEAT_BODY.pack(stream, op, columns))

    # ------------------------------------------------------------------------------- CALL
    def call(self, name: str, args: Any = None, timeout_s: float | None = None) -> Any:
        """A control call the learner's hub answers (small JSON arguments and answer)."""
        return self.call_soon(name, args).result(timeout_s)

    def call_soon(self, name: str, args: Any = None) -> Future[Any]:
        """`call`'s answer as a Future, without waiting for it."""
        future: Future[Any] = Future()
        request = self._track(future, Kind.CALL, -1, 0)
        self._send(Kind.CALL, request, body=ch.to_json({"name": name, "args": args}))
        return future

    # -------------------------------------------------------------------------- internals
    def give_back(self, kind: Kind, slot: int) -> None:
        with self._lock:
            self._pools[kind].give(slot)

    def _track(self, future: Future[Any], kind: Kind, slot: int, rows: int) -> int:
        with self._lock:
            if self._error is not None:
                if slot >= 0:
                    self._pools[kind].give(slot)
                raise Unavailable(str(self._error))
            request = next(self._ids)
            self._pending[request] = (future, kind, slot, rows)
            return request

    def _send(self, kind: Kind, request: int, slot: int = 0, flags: int = 0,
              body: bytes = b"") -> None:  # fmt: skip
        try:
            self._channel.send(kind, request, max(slot, 0), flags, body)
        except OSError as error:
            self._down(f"sending failed ({error})")

    def on_ask(self, answer: Callable[[int], None]) -> None:
        """Have `answer(number)` called, on the reader thread, for each ASK of the learner's
        (it must return at once, e.g. with a `call_soon`)."""
        self._on_ask = answer

    def _read(self) -> None:
        while (message := self._channel.receive()) is not None:
            if message.kind is Kind.ASK:
                self._on_ask(message.request)
                continue
            if message.kind is Kind.QUEUED:  # not the answer: the entry stays pending
                with self._lock:
                    queued = self._pending.get(message.request)
                if queued is not None and isinstance(queued[0], RolloutFuture):
                    queued[0].queued.set()
                continue
            with self._lock:
                entry = self._pending.pop(message.request, None)
            if entry is None:
                continue
            future, kind, slot, rows = entry
            if message.kind is Kind.FAILED:
                outcome: Any = ch.error_from(message.body)
            elif message.kind is Kind.ACTED:
                (version,) = ch.ACTED_BODY.unpack(message.body)
                views = self._act_views[slot]  # copied out before the slot goes back
                actions, log_probs, values = (views[name][:rows].copy() for name in ACT_OUT)
                outcome = ActResult(actions, log_probs, values, version)
            elif message.kind is Kind.STEPPED:
                outcome = ch.result_from(message.body)
            else:
                outcome = json.loads(message.body)
            if message.flags & ch.RELEASED:
                self.give_back(kind, slot)
            if isinstance(outcome, Exception):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)
        self._down("this front end closed the handoff" if self._closing else
                   "the learner process closed its end of the handoff (it exited or was killed)")

    def _down(self, why: str) -> None:
        """Fail every waiting call and every later one."""
        with self._lock:
            if self._error is None:
                self._error = Unavailable(f"handoff: {why}")
            pending, self._pending = self._pending, {}
            for pool in self._pools.values():
                pool.wake.notify_all()
        for future, *_ in pending.values():
            if not future.done():
                future.set_exception(self._error)
