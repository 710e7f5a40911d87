"""One Interact stream's Steps: each rollout its Unroller completes goes to the engine as the
keyed Step (actor_id, first_sequence + k), and its outcome rides on a later response.

Backpressure by waiting, not by refusing: a stream has at most one Step queued or being
applied; the rollout after it waits (and so do the stream's next actions) until it is done,
and a full queue is waited out. That bounds what a stream holds to three rollouts (one
training, one filling, one its leading group opened) and the policy lag its own Steps add to
one version. Exactly once: every rollout is a keyed Step, so an
actor that lost the stream sends the rollouts whose outcome it has not seen again (unary Step,
same key) and the engine answers, joins or applies each; the partial rollout of a broken stream
is not trained on, and the actor counts its env steps as abandoned.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from service.errors import ForgottenStepKey, KeyReused, QueueFull
from service.server.engine import Engine
from service.step_ledger import StepKey
from service.types import Rollout, StepResult

QUEUE_FULL_WAIT_S = 0.005  # between tries of a full Step queue, doubling to 0.1 s


@dataclass(frozen=True)
class Outcome:
    """What became of rollout `sequence`: the Step's result, or the error it was refused with."""

    sequence: int
    result: StepResult | None
    error: Exception | None


class InteractSteps:
    """The Steps of one stream, and their outcomes not yet reported; used by the stream's
    handler thread alone."""

    def __init__(
        self,
        engine: Engine,
        actor: str,
        first_sequence: int,
        active: Callable[[], bool],
        settled: Callable[[int], None] = lambda k: None,
    ) -> None:
        """`settled(k)` is called once rollout k's Step is done (its arrays read no more)."""
        self.engine, self.actor, self.first_sequence = engine, actor, first_sequence
        self.active, self.settled = active, settled
        self._pending: tuple[int, Future[StepResult]] | None = None
        self._outcomes: list[Outcome] = []

    def submit(self, k: int, rollout: Rollout) -> None:
        """Queue rollout k as a keyed Step once the stream's previous Step is done. A key the
        server refuses at once (held for other content, or forgotten) is rollout k's outcome."""
        self._settle(wait=True)
        key = StepKey(self.actor, self.first_sequence + k)
        delay = QUEUE_FULL_WAIT_S
        while True:
            try:
                future = self.engine.submit_step(rollout, self.active, key)
                break
            except QueueFull:
                if not self.active():
                    raise
                time.sleep(delay)
                delay = min(0.1, 2 * delay)
            except (KeyReused, ForgottenStepKey) as refused:
                self._outcomes.append(Outcome(key.sequence, None, refused))
                self.settled(k)
                return
        self._pending = (key.sequence, future)

    def take_outcomes(self) -> list[Outcome]:
        """The outcomes that arrived since the last call, oldest first."""
        self._settle(wait=False)
        outcomes, self._outcomes = self._outcomes, []
        return outcomes

    def finish(self) -> None:
        """Wait for the stream's last Step (the actor closed its side)."""
        self._settle(wait=True)

    def _settle(self, wait: bool) -> None:
        """Record the pending Step's outcome once it is done (waiting for it with `wait`)."""
        if self._pending is None:
            return
        sequence, future = self._pending
        if not (wait or future.done()):
            return
        error = future.exception()
        self._outcomes.append(Outcome(sequence, None if error else future.result(), error))
        self._pending = None
        self.settled(sequence - self.first_sequence)
