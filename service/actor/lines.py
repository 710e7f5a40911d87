"""The actor's lines beside its progress: its server's outages (gone, each reconnect attempt,
back, and what became of the rollouts sent again), the rollouts the server dropped, the rates
and latencies of its progress and `done:` lines, and what of its work a checkpoint holds."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

import grpc
import numpy as np

from service.api.trident.v1 import trainer_pb2 as pb
from service.client.resilient import (
    MAX_WAIT_S,
    LinkCounts,
    Resends,
    ahead,
    periodic_checkpoints,
)
from service.types import HEADS


def latency_ms(name: str, seconds: list[float]) -> str:
    """`NAME p50 X ms p99 Y ms` of the wall times `seconds`."""
    if not seconds:
        return f"{name} p50 n/a p99 n/a"
    p50, p99 = np.percentile(np.asarray(seconds) * 1e3, [50, 99])
    return f"{name} p50 {p50:.2f} ms p99 {p99:.2f} ms"


def say(line: str) -> None:
    """One of the actor's lines, on stdout with its progress lines, at once."""
    print(f"trident actor: {line}", flush=True)


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


class Sending(Protocol):
    """What the outage lines tell of an actor: the rollouts it keeps to send again, the env
    steps of its partial rollout, and the rollouts it has sent again so far."""

    @property
    def unanswered(self) -> int: ...

    @property
    def unconfirmed(self) -> int: ...

    @property
    def partial_env_steps(self) -> int: ...

    @property
    def resends(self) -> Resends: ...


ATTEMPT_LINE_S = 10.0  # once the backoff is at MAX_WAIT_S: at most one attempt line this often


class OutageLines:
    """The actor's lines about its server's outages (a LinkWatcher of its ResilientLink):
    gone, each reconnect attempt, back. The back line waits for `settle`, which the actor
    calls once it has sent again what the outage left unanswered, so that it can say what
    became of those; `settle` also tells of rollouts sent again with no outage (a reply from
    a state the server went back to by Restore)."""

    def __init__(
        self,
        target: str,
        reconnect_s: float,
        clock: Callable[[], float] = time.monotonic,
        actor: Sending | None = None,
    ) -> None:
        self.target, self.reconnect_s, self.clock = target, reconnect_s, clock
        self.starting = True  # no status yet: the actor's first call
        self.actor = actor  # what it keeps to send again; None: nothing to tell of
        self._said = Resends()  # counts.again when the last line told of resends
        self._back = ""  # the back line's first half, until settle() tells what was resent
        self._capped_said = float("-inf")  # when an attempt line at MAX_WAIT_S was said

    def away(self, error: grpc.RpcError) -> None:
        self.settle()  # a back line still open: an outage while sending again
        code, details = error.code().name, " ".join((error.details() or "").split())
        if len(details) > 160:
            details = details[:157] + "..."
        backoff = f"with backoff up to {MAX_WAIT_S:g} s"
        limit = f"for up to {self.reconnect_s:g} s (--reconnect-timeout)"
        if self.starting:
            say(f"no server at {self.target} yet ({code}); waiting up to {self.reconnect_s:g} "
                f"s for it (--reconnect-timeout), retrying {backoff}")  # fmt: skip
            return
        actor = self.actor
        unanswered = actor.unanswered if actor is not None else 0
        unconfirmed = actor.unconfirmed if actor is not None else 0
        partial = actor.partial_env_steps if actor is not None else 0
        left = f", leaving the partial rollout's {partial} env steps" if partial else ""
        say(f"server at {self.target} unavailable ({code}: {details}): keeping "
            f"{plural(unanswered + unconfirmed, 'rollout')} to send again ({unanswered} "
            f"unanswered, {unconfirmed} answered but in no checkpoint yet){left}; the "
            f"environments wait, reconnecting {backoff} {limit}")  # fmt: skip

    def attempt(self, number: int, pause_s: float, backoff_s: float, waited_s: float) -> None:
        capped = ""
        if backoff_s >= MAX_WAIT_S:  # the backoff stopped growing: one line each ATTEMPT_LINE_S
            now = self.clock()
            if now - self._capped_said < ATTEMPT_LINE_S:
                return
            if self._capped_said == float("-inf"):
                capped = f"; from here one line each {ATTEMPT_LINE_S:g} s"
            self._capped_said = now
        say(f"reconnect attempt {number} in {pause_s:.2f} s (backoff up to {backoff_s:.2g} s; "
            f"{waited_s:.1f} s of {self.reconnect_s:g} s waited{capped})")  # fmt: skip

    def back(self, status: pb.GetStatusResponse, attempts: int, waited_s: float,
             new_state: bool) -> None:  # fmt: skip
        self._capped_said = float("-inf")
        after = f"after {waited_s:.1f} s ({plural(attempts, 'attempt')})"
        if self.starting:
            say(f"server at {self.target} answered {after}")
            return
        state = "a restarted state" if new_state else "the same state"
        self._back = (f"server at {self.target} back {after}, {state} at global step "
                      f"{status.global_step}")  # fmt: skip

    def settle(self) -> None:
        """Say the open back line, or rollouts sent again since the last line said so."""
        if self.actor is None:
            return
        again = self.actor.resends
        sent = again.since(self._said)
        self._said = replace(again)
        if self._back:
            say(f"{self._back}: {resent(sent)}")
            self._back = ""
        elif sent.total:
            say(f"the server's state changed under a reply (a Restore): {resent(sent)}")


def resent(sent: Resends) -> str:
    """`resent N rollouts: T trained, R replayed (already applied), D dropped (...)`."""
    dropped = sent.dropped_behind + sent.dropped_ahead
    why = []
    if sent.dropped_behind:
        why.append(f"{sent.dropped_behind} behind the policy lag, train.max_policy_lag")
    if sent.dropped_ahead:
        why.append(f"{sent.dropped_ahead} ahead of the server's state, which went back to an "
                   "older checkpoint")  # fmt: skip
    because = f" ({'; '.join(why)})" if why else ""
    return (f"resent {plural(sent.total, 'rollout')}: {sent.trained} trained, {sent.replayed} "
            f"replayed (already applied), {dropped} dropped{because}")  # fmt: skip


DROPPED = {
    "behind": "behind the policy lag (acted on more than train.max_policy_lag policy versions "
    "before the Step that would train it: this actor paused, or the server fell behind)",
    "ahead": "ahead of the server's state (acted on by a policy the server no longer has: it "
    "went back to an older checkpoint)",
}


class DropLines:
    """Rollouts the server refused for their policy version, on the actor's own terminal as
    they happen: the first of each reason in full (the server's words and what they mean),
    later ones counted in the progress lines and the done: line."""

    def __init__(self) -> None:
        self.said: set[str] = set()

    def dropped(self, details: str) -> None:
        reason = "ahead" if ahead(details) else "behind"
        if reason not in self.said:
            self.said.add(reason)
            say(f"the server dropped a rollout {DROPPED[reason]}: {details}. Further drops "
                "are counted in the progress lines")  # fmt: skip

    @staticmethod
    def counts(counts: LinkCounts) -> str:
        """` | dropped N behind, M ahead` where any were, else ""."""
        parts = [f"{count} {reason}" for reason, count in
                 (("behind", counts.dropped_behind), ("ahead", counts.dropped_ahead)) if count]
        return f" | dropped {', '.join(parts)}" if parts else ""  # fmt: skip


RATE_SPAN_S = 1.0  # the shortest span a progress line's rate is taken over


class Rate:
    """Env steps per second over the last interval: since the progress line before, or
    before that where the line before came less than RATE_SPAN_S ago (replies come in
    bursts: one Step answers several rollouts at once). The whole run's is the done: line's."""

    def __init__(self, started: float) -> None:
        self.marks: deque[tuple[float, int]] = deque([(started, 0)], maxlen=256)

    def since(self, now: float, env_steps: int) -> str:
        """`R env steps/s (last S s)`, and this line's mark for the next."""
        at, before = self.marks[0]
        for mark_at, mark_steps in reversed(self.marks):
            if now - mark_at >= RATE_SPAN_S:
                at, before = mark_at, mark_steps
                break
        self.marks.append((now, env_steps))
        seconds = max(now - at, 1e-9)
        return f"{(env_steps - before) / seconds:7.0f} env steps/s (last {seconds:.1f} s)"


LOSS_ORDER = ("total", *HEADS)  # the loss columns of a progress line, in every process alike


def loss_columns(losses: dict[str, float]) -> list[str]:
    """The heads a reply has losses of, in LOSS_ORDER (a head the order lacks: after, sorted),
    so every actor's lines put the same column in the same place."""
    known = [head for head in LOSS_ORDER if head in losses]
    return known + sorted(set(losses) - set(LOSS_ORDER))


def durability(counts: LinkCounts, status: pb.GetStatusResponse) -> str:
    """What of the applied Steps a checkpoint holds, plainly when the server saves none."""
    answered = counts.answered
    if not periodic_checkpoints(status) and counts.durable == 0:
        return (f"durable: none of {answered} answered (the server saves no periodic "
                "checkpoints, checkpoint.every_steps and .every_s are 0: a restart loses them; "
                "--wait-checkpoint asks it for one)")  # fmt: skip
    lost = f", {counts.lost} lost with a state the server went back from" if counts.lost else ""
    return (f"durable: {counts.durable} of {answered} answered in a checkpoint, "
            f"{counts.not_yet_durable} not yet{lost}")  # fmt: skip
