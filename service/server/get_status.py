"""GetStatus's answer, assembled in one place: the proto's message is the one record of what a
status holds. Its fields come from the rooms behind the seam (`learner_api`): the Learner's
state, settings and recent work, the Checkpointer's newest checkpoint, the server's own
identity; they are read under the learner's lock, so they describe one state.
"""

from __future__ import annotations

import json
from collections import deque
from typing import TYPE_CHECKING, Any

from service import trident_version
from service.api.trident.v1 import trainer_pb2 as pb
from service.trainer import schedule

if TYPE_CHECKING:  # the rooms read here hold a RecentSteps of this module's
    from service.server.checkpointer import Checkpointer
    from service.server.learner import Learner

RATE_WINDOW_S = 60.0  # GetStatus's env steps per second: over the Steps of this long


class RecentSteps:
    """The Steps that ended in the last RATE_WINDOW_S (of the learner's clock), for GetStatus's
    rate, and when the newest ended. Its owner serialises access (the learner's lock)."""

    def __init__(self) -> None:
        self._steps: deque[tuple[float, float, int]] = deque()  # (start, end, env steps)
        self.last_end: float | None = None  # the clock at the newest Step applied

    def add(self, start: float, end: float, env_steps: int) -> None:
        """A Step that ran from `start` to `end`; those out of the window by then are let go,
        so a server nobody asks for its status keeps a window's Steps, not all of them."""
        self._steps.append((start, end, env_steps))
        self.last_end = end
        self._forget(end)

    def per_second(self, now: float) -> float:
        """The env steps per second of the Steps that ended in the last RATE_WINDOW_S, over
        that, or since the first of them began where that is sooner: a server that started
        training 5 s ago has a rate of 5 s."""
        self._forget(now)
        span = min(RATE_WINDOW_S, now - self._steps[0][0]) if self._steps else RATE_WINDOW_S
        return sum(samples for *_, samples in self._steps) / max(span, 1e-9)

    def _forget(self, now: float) -> None:
        """Let go of the Steps that ended before the window that ends at `now`."""
        while self._steps and self._steps[0][1] < now - RATE_WINDOW_S:
            self._steps.popleft()


def status_response(
    learner: Learner, checkpointer: Checkpointer, inference_only: bool
) -> pb.GetStatusResponse:
    """GetStatus's answer for the server whose rooms these are."""
    with learner.lock:
        trainer = learner.trainer
        server = trainer.config.server
        return pb.GetStatusResponse(
            global_step=trainer.global_step,
            backend=trainer.backend.name,
            device=trainer.backend.device,
            config_json=json.dumps(trainer.config.public_dict()),
            param_digest=trainer.param_digest(),
            inference_only=inference_only,
            step_queue_depth=learner.queue_depth,
            replay_size=len(trainer.state.replay),
            version=trident_version(),
            kernel_abi_version=trainer.backend.kernel_abi_version,
            auth_mode=server.client_auth(),
            auth_token_set=bool(server.auth_token or server.auth_tokens_file),
            checkpoint_step=learner.checkpoint_step,
            state_epoch=learner.state_epoch,
            learning_rate=learner.next_rate(),
            lr_schedule=schedule.where(trainer.config.train, trainer.global_step),
            **_activity(learner, checkpointer),
        )


def _activity(learner: Learner, checkpointer: Checkpointer) -> dict[str, Any]:
    """The recent work: the env steps per second, the streams open, the newest Step's and
    checkpoint's ages; the caller holds the learner's lock."""
    now = learner.clock()
    newest, committed_at = checkpointer.newest
    last_step = learner.recent.last_end
    return {
        "env_steps_per_s": learner.recent.per_second(now),
        "open_streams": learner.open_streams,
        "seconds_since_step": None if last_step is None else now - last_step,
        "checkpoint_name": newest or "",
        "checkpoint_age_s": None if newest is None else now - committed_at,
    }
