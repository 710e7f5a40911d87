"""One Interact stream's Steps: each rollout its Unroller completes goes to the learner as the
keyed Step (actor_id, first_sequence + k), trained side by side with other streams' rollouts
in the learner's Step, and its outcome rides on a later response.

The stream holds a seat at the learner (`learner_api.StreamSeat`, a place at its Step queue):
its columns count towards a Step's size, and its rollouts queue without waiting for each
other's Steps, so one actor with fewer environments than a Step fills it with several rollouts.
Backpressure by waiting, not by refusing: a full queue is waited out (the stream's next actions
wait meanwhile). Exactly once: every rollout is a keyed Step, so an actor that lost the stream
sends the rollouts whose outcome it has not seen again (unary Step, same key) and the learner
answers, joins or applies each; the partial rollout of a broken stream is not trained on, and
the actor counts its env steps as abandoned. A rollout the server will not train on is its
outcome (the refusal's status), counted by the learner by reason, and said in the log: at the
first of each reason on the stream, and with the counts when the stream ends.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from service import logs
from service.errors import ForgottenStepKey, KeyReused, StalePolicy
from service.server.learner_api import LearnerApi
from service.server.status import drop_reason
from service.step_ledger import StepKey
from service.types import Rollout, StepResult


@dataclass(frozen=True)
class Outcome:
    """What became of rollout `sequence`: the Step's result, or the error it was refused with."""

    sequence: int
    result: StepResult | None
    error: Exception | None


class InteractSteps:
    """The Steps of one stream, and their outcomes not yet reported; used by the stream's
    handler thread alone. `close()` when the stream ends."""

    def __init__(
        self,
        learner: LearnerApi,
        actor: str,
        first_sequence: int,
        columns: int,
        active: Callable[[], bool],
        settled: Callable[[int], None] = lambda k: None,
    ) -> None:
        """`settled(k)` is called once rollout k's Step is done (its arrays read no more)."""
        self.actor, self.first_sequence = actor, first_sequence
        self.active, self.settled = active, settled
        self.seat = learner.open_seat(columns)
        self._pending: deque[tuple[int, Future[StepResult]]] = deque()  # (k, its Step)
        self._outcomes: list[Outcome] = []
        self.dropped: Counter[str] = Counter()  # rollouts refused, by reason

    def submit(self, k: int, rollout: Rollout) -> None:
        """Queue rollout k as a keyed Step, once the queue has room. A key the server refuses
        at once (held for other content, or forgotten), or a policy version the learner would
        refuse, is rollout k's outcome."""
        key = StepKey(self.actor, self.first_sequence + k)
        try:
            future = self.seat.submit(rollout, self.active, key)
        except (KeyReused, ForgottenStepKey, StalePolicy) as refused:
            self._record(Outcome(key.sequence, None, refused))
            self.settled(k)
            return
        self._pending.append((k, future))

    def take_outcomes(self) -> list[Outcome]:
        """The outcomes that arrived since the last call, oldest first."""
        self._settle(wait=False)
        outcomes, self._outcomes = self._outcomes, []
        return outcomes

    def finish(self) -> None:
        """Wait for every Step of the stream's rollouts (a synchronous stream's, or the last
        ones when the actor closed its side)."""
        with self.seat.waiting():
            self._settle(wait=True)

    def close(self) -> None:
        """Leave the Step queue; log what was dropped over the stream's life."""
        self.seat.close()
        if self.dropped:
            logs.event(logging.WARNING, "stream ended with rollouts dropped", actor=self.actor,
                       dropped=dict(self.dropped))  # fmt: skip

    def _settle(self, wait: bool) -> None:
        """Record the outcomes of the Steps that are done, in the rollouts' order (waiting for
        each with `wait`)."""
        while self._pending:
            k, future = self._pending[0]
            if not (wait or future.done()):
                return
            error = future.exception()
            self._record(Outcome(self.first_sequence + k, None if error else future.result(),
                                 error))  # fmt: skip
            self._pending.popleft()
            self.settled(k)

    def _record(self, outcome: Outcome) -> None:
        reason = None if outcome.error is None else drop_reason(outcome.error)
        if reason is not None:
            if not self.dropped[reason]:
                logs.event(logging.WARNING, "rollout dropped", actor=self.actor,
                           sequence=outcome.sequence, reason=reason, why=str(outcome.error),
                           later="counted, and summed when the stream ends")  # fmt: skip
            self.dropped[reason] += 1
        self._outcomes.append(outcome)
