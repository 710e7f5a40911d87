"""A client that rides through server restarts: what `trident actor` sends its Steps with.

`ResilientLink` waits for a server that went away (killed, draining, being upgraded) instead of
failing: a call that meets UNAVAILABLE polls GetStatus with backoff until the server answers or
`reconnect_s` passes, hands the new status to `on_reconnect` (the actor re-reads the model
shape there), and tries again. Every Step carries an idempotency key (this link's actor id and
its own sequence number), so sending one again is safe: the server answers a key it applied.

A Step the server answered is not safe yet: a server killed before its next checkpoint comes
back from an older state without it. The link keeps each answered rollout until a reply (or
GetStatus) shows it in a checkpoint of the same state (`checkpoint_step`, `state_epoch`): then
it is durable. When a reply names a new state epoch, it sends the kept ones again, and the
server applies those its restored state lacks and answers the rest. Past `keep` rollouts the
oldest are let go of (their steps still counted durable once a checkpoint holds them, lost if
the state goes back first). A rollout refused for its policy version is dropped and counted:
behind (older than `train.max_policy_lag` allows) or ahead (newer than a server whose state
went back to an older checkpoint). `wait_durable` waits, at the end, until every answered Step
is in a checkpoint.

A `LinkWatcher` hears of each outage as it happens: the server going away, each attempt to
reach it (with its backoff) and its return; `LinkCounts.again` counts what became of the
rollouts sent again, so a caller can say so each time it has sent them.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import grpc
import numpy as np

from service.api.trident.v1 import trainer_pb2 as pb
from service.client.client import StepReply, TridentClient
from service.errors import TridentError
from service.step_ledger import ACTOR_ID, AHEAD, StepKey
from service.types import ActMode, ActResult, Rollout

Code = grpc.StatusCode
Answer = TypeVar("Answer")
GONE = (Code.UNAVAILABLE, Code.DEADLINE_EXCEEDED, Code.CANCELLED)  # the server went away
BUSY = (Code.RESOURCE_EXHAUSTED,)  # a full Step queue: the same Step later
MAX_WAIT_S = 2.0


def stale(details: str | None) -> bool:
    """Whether a FAILED_PRECONDITION refused a rollout for its policy version."""
    return "policy_version" in (details or "")


def ahead(details: str | None) -> bool:
    """Whether a policy-version refusal was for a version newer than the server's state (it
    went back to an older checkpoint), not older than its lag allows."""
    return AHEAD in (details or "")


class ServerGone(TridentError):
    """The server did not come back within the reconnect timeout."""


def new_actor_id() -> str:
    """Unique per actor process: host, pid and random bits (a restarted actor is a new one)."""
    host = "".join(c if c.isalnum() or c in ".-" else "-" for c in socket.gethostname())[:64]
    actor = f"{host or 'host'}-{os.getpid()}-{secrets.token_hex(4)}"
    return actor if ACTOR_ID.fullmatch(actor) else f"actor-{secrets.token_hex(8)}"


@dataclass
class _Sent:
    """An answered rollout not yet known to be in a checkpoint."""

    key: StepKey
    rollout: Rollout
    epoch: int
    step: int


@dataclass
class Resends:
    """What became of the rollouts sent again: those an Interact stream that broke left
    unanswered, and those answered under a state the server went back from."""

    trained: int = 0  # applied by this send
    replayed: int = 0  # answered from the server's ledger: applied before
    dropped_behind: int = 0  # refused: older than train.max_policy_lag allows
    dropped_ahead: int = 0  # refused: newer than the server's state (it went back)

    @property
    def total(self) -> int:
        return self.trained + self.replayed + self.dropped_behind + self.dropped_ahead

    def since(self, before: Resends) -> Resends:
        """What was resent after `before` (an earlier copy of these counts)."""
        return Resends(self.trained - before.trained, self.replayed - before.replayed,
                       self.dropped_behind - before.dropped_behind,
                       self.dropped_ahead - before.dropped_ahead)  # fmt: skip


@dataclass
class LinkCounts:
    """What happened to this link's rollouts."""

    rollouts: int = 0  # new rollouts given to step()
    answered: int = 0  # of those, answered (applied now, or before under the same key)
    replayed: int = 0  # answers that came from the server's ledger
    again: Resends = field(default_factory=Resends)  # rollouts sent again, by outcome
    dropped_behind: int = 0  # refused: older than train.max_policy_lag allows
    dropped_ahead: int = 0  # refused: newer than the server's state (it went back)
    durable: int = 0  # answered, and seen in a checkpoint of the server's state
    lost: int = 0  # answered, let go of, and the server's state went back before a checkpoint
    reconnects: int = 0  # outages waited through
    dropped_keys: list[StepKey] = field(default_factory=list)

    @property
    def resent(self) -> int:
        """Rollouts sent again (after a broken stream, or to a state that went back)."""
        return self.again.total

    @property
    def not_yet_durable(self) -> int:
        """Answered rollouts no checkpoint is known to hold yet (neither durable nor lost)."""
        return self.answered - self.durable - self.lost


class LinkWatcher(Protocol):
    """Told of each outage as the link waits it out (the actor prints these)."""

    def away(self, error: grpc.RpcError) -> None:
        """The server went away: `error` is what the call that found out met."""

    def attempt(self, number: int, pause_s: float, backoff_s: float, waited_s: float) -> None:
        """Attempt `number` to reach the server comes after `pause_s` (drawn from [0,
        `backoff_s`]), `waited_s` into the outage."""

    def back(self, status: pb.GetStatusResponse, attempts: int, waited_s: float,
             new_state: bool) -> None:  # fmt: skip
        """The server answered at attempt `attempts`, `waited_s` after it went away;
        `new_state`: with another state than the link last saw (it restarted)."""


class Unwatched:
    """A LinkWatcher that says nothing."""

    def away(self, error: grpc.RpcError) -> None:
        pass

    def attempt(self, number: int, pause_s: float, backoff_s: float, waited_s: float) -> None:
        pass

    def back(self, status: pb.GetStatusResponse, attempts: int, waited_s: float,
             new_state: bool) -> None:  # fmt: skip
        pass


class ResilientLink:
    def __init__(
        self,
        client: TridentClient,
        on_reconnect: Callable[[pb.GetStatusResponse], None] = lambda status: None,
        reconnect_s: float = 300.0,
        keep: int = 256,
        actor_id: str | None = None,
        watcher: LinkWatcher | None = None,
    ) -> None:
        self.client = client
        self.on_reconnect = on_reconnect
        self.reconnect_s = reconnect_s
        self.watcher: LinkWatcher = watcher or Unwatched()
        self.actor_id = actor_id or new_actor_id()
        self.counts = LinkCounts()
        self._sequence = 0
        self._epoch: int | None = None
        self._unconfirmed: deque[_Sent] = deque()
        self._released: deque[tuple[int, int]] = deque()  # (epoch, step) of those let go of
        self._keep = keep

    # ------------------------------------------------------------------------ calls
    def status(self) -> pb.GetStatusResponse:
        """The server's status, waiting for the server while it is gone, as every call does."""
        return self._through_outages(self.client.status)

    def act(self, obs: np.ndarray, mode: ActMode = ActMode.SAMPLE) -> ActResult:
        return self._through_outages(lambda: self.client.act(obs, mode))

    def step(self, rollout: Rollout) -> StepReply | None:
        """Send a new rollout; its reply, or None when it was dropped as too stale."""
        reply = self._send(self.new_key(), rollout)
        if reply is not None:
            self.counts.answered += 1
        return reply

    def new_key(self) -> StepKey:
        """The key of this link's next new rollout (a Step, or one an Interact stream made)."""
        key = StepKey(self.actor_id, self._sequence)
        self._sequence += 1
        self.counts.rollouts += 1
        return key

    @property
    def next_sequence(self) -> int:
        """The sequence `new_key` gives next."""
        return self._sequence

    @property
    def unconfirmed(self) -> int:
        """Answered rollouts kept to send again should the server come back from an older
        state (no checkpoint is known to hold them yet)."""
        return len(self._unconfirmed)

    def send_lost(self, key: StepKey, rollout: Rollout) -> StepReply | None:
        """Send again, as a keyed Step, rollout `key` whose Interact stream broke before its
        outcome came; its reply, or None when it was dropped as too stale."""
        reply = self._send(key, rollout, again=True)
        if reply is not None:
            self.counts.answered += 1
        return reply

    def answered(self, key: StepKey, rollout: Rollout, reply: StepReply) -> None:
        """Take an Interact stream's reply to rollout `key`, as `step` takes its own."""
        self.counts.answered += 1
        self._record(key, rollout, reply)

    def dropped(self, key: StepKey, details: str) -> None:
        """Count rollout `key` as refused for its policy version (`details`: the refusal)."""
        if ahead(details):
            self.counts.dropped_ahead += 1
        else:
            self.counts.dropped_behind += 1
        self.counts.dropped_keys.append(key)

    def _send(self, key: StepKey, rollout: Rollout, again: bool = False) -> StepReply | None:
        """Send rollout `key` (`again`: not for the first time, counted in counts.again)."""
        try:
            reply = self._through_outages(lambda: self.client.step(rollout, key=key))
        except grpc.RpcError as error:
            if error.code() != Code.FAILED_PRECONDITION or not stale(error.details()):
                raise
            self.dropped(key, error.details() or "")
            if again and ahead(error.details()):
                self.counts.again.dropped_ahead += 1
            elif again:
                self.counts.again.dropped_behind += 1
            return None
        if again and reply.replayed:
            self.counts.again.replayed += 1
        elif again:
            self.counts.again.trained += 1
        self._record(key, rollout, reply)
        return reply

    def _record(self, key: StepKey, rollout: Rollout, reply: StepReply) -> None:
        self.counts.replayed += reply.replayed
        self._kept(key, rollout, reply)

    def reconnect(self, error: grpc.RpcError) -> pb.GetStatusResponse:
        """After `error` (one of GONE) broke a call or a stream: wait for the server as any
        call does, then send again, oldest first, the answered rollouts a state it went back
        from lost. The server's status."""
        self.counts.reconnects += 1
        status = self.wait_for_server(error)
        self._catch_up(status)
        return status

    def _through_outages(self, call: Callable[[], Answer]) -> Answer:
        """`call()`, waiting for the server while it is gone or busy."""
        while True:
            try:
                return call()
            except grpc.RpcError as error:
                if error.code() in BUSY:
                    time.sleep(random.uniform(0.05, 0.5))
                    continue
                if error.code() not in GONE:
                    raise
                gone = error
            self.counts.reconnects += 1
            self.wait_for_server(gone)

    def wait_for_server(self, error: grpc.RpcError) -> pb.GetStatusResponse:
        """Poll GetStatus until the server answers, with exponential backoff (full jitter, up
        to MAX_WAIT_S) for up to `reconnect_s` (then ServerGone), telling the watcher of the
        outage (`error`: what found it gone), each attempt and the return; hand the status
        to `on_reconnect` and return it."""
        self.watcher.away(error)
        started = time.monotonic()
        delay, attempt = 0.1, 0
        while True:
            attempt += 1
            pause = random.uniform(0, delay)
            self.watcher.attempt(attempt, pause, delay, time.monotonic() - started)
            time.sleep(pause)
            try:
                status = self.client.status()
                break
            except grpc.RpcError as error:
                if error.code() not in GONE or time.monotonic() - started > self.reconnect_s:
                    raise ServerGone(
                        f"{self.client.target}: the server did not come back within "
                        f"{self.reconnect_s:g} s (last: {error.code().name} {error.details()})"
                    ) from None
            delay = min(MAX_WAIT_S, 2 * delay)
        new_state = self._epoch is not None and status.state_epoch != self._epoch
        self.watcher.back(status, attempt, time.monotonic() - started, new_state)
        self.on_reconnect(status)
        return status

    # ------------------------------------------------------------------------ durability
    def _kept(self, key: StepKey, rollout: Rollout, reply: StepReply) -> None:
        """Keep the rollout until a checkpoint of this state holds it; on a new state epoch,
        send again what the old state had not checkpointed."""
        changed = self._epoch is not None and reply.state_epoch != self._epoch
        self._epoch = reply.state_epoch
        if reply.global_step > reply.checkpoint_step:
            self._unconfirmed.append(_Sent(key, rollout, reply.state_epoch, reply.global_step))
        else:
            self.counts.durable += 1
        if changed:
            self._resend_lost()
        self._confirm(reply.state_epoch, reply.checkpoint_step)
        while len(self._unconfirmed) > self._keep:
            sent = self._unconfirmed.popleft()
            self._released.append((sent.epoch, sent.step))

    def _confirm(self, epoch: int, checkpoint_step: int) -> None:
        """Count as durable what a checkpoint of state `epoch` up to `checkpoint_step` holds."""
        held = lambda sent_epoch, step: sent_epoch == epoch and step <= checkpoint_step  # noqa: E731
        kept = deque(sent for sent in self._unconfirmed if not held(sent.epoch, sent.step))
        released = deque(entry for entry in self._released if not held(*entry))
        self.counts.durable += len(self._unconfirmed) - len(kept)
        self.counts.durable += len(self._released) - len(released)
        self._unconfirmed, self._released = kept, released

    def _resend_lost(self) -> None:
        """Send again, oldest first, every kept rollout answered under an older state; those
        let go of are lost."""
        older = [sent for sent in self._unconfirmed if sent.epoch != self._epoch]
        self._unconfirmed = deque(sent for sent in self._unconfirmed if sent.epoch == self._epoch)
        released = deque(entry for entry in self._released if entry[0] == self._epoch)
        self.counts.lost += len(self._released) - len(released)
        self._released = released
        for sent in older:  # each answer is kept under the new epoch by _send
            self._send(sent.key, sent.rollout, again=True)

    def _catch_up(self, status: pb.GetStatusResponse) -> None:
        """Take the server's `status`: a new state epoch (it restarted, or restored) means
        sending again what the old state had not checkpointed; then count what its
        checkpoint holds."""
        if status.state_epoch != self._epoch:
            self._epoch = status.state_epoch
            self._resend_lost()
        self._confirm(status.state_epoch, status.checkpoint_step)

    def wait_durable(self, timeout_s: float, poll_s: float = 0.5) -> bool:
        """Wait until a checkpoint of the server's state holds every answered rollout: asks
        for one (Checkpoint) where the token may, else waits for the server's periodic saves,
        sending again what a state that went back lost. True when all are durable; False at
        `timeout_s`, or at once when the token may not ask and the server saves none."""
        deadline = time.monotonic() + timeout_s
        may_ask = True
        while self._unconfirmed or self._released:
            status = self.status()
            if status.state_epoch != self._epoch:
                self._catch_up(status)
                continue
            self._confirm(status.state_epoch, status.checkpoint_step)
            if not (self._unconfirmed or self._released):
                break
            if may_ask:
                may_ask = False
                try:
                    self._through_outages(self.client.checkpoint)
                    continue
                except grpc.RpcError as error:
                    if error.code() not in (Code.PERMISSION_DENIED, Code.UNAUTHENTICATED):
                        raise
                if not periodic_checkpoints(status):
                    return False
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)
        return True


def periodic_checkpoints(status: pb.GetStatusResponse) -> bool:
    """Whether the server saves checkpoints on its own (checkpoint.every_steps or .every_s)."""
    checkpoint = json.loads(status.config_json)["checkpoint"]
    return bool(checkpoint["every_steps"] or checkpoint.get("every_s"))
