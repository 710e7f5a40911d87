"""The actor's side of its Interact streams (StreamActor): its env groups, the rollouts the server
has not answered yet, a reconnect that sends those again as keyed Steps, and what the actor's
lines report (Progress)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
import numpy as np

from service.client.client import StepReply
from service.client.interact import InteractOutcome, InteractReply, InteractStream
from service.client.resilient import (
    GONE,
    ResilientLink,
    stale,
)
from service.envs import EpisodeEnv
from service.errors import TridentError
from service.step_ledger import StepKey
from service.types import Rollout
from service.unroll import GroupStep, Unroller
from service.vector_env import EnvStep


class ActorError(TridentError):
    """The actor cannot run: the server's model does not fit its env, or the server is
    inference-only."""


@dataclass
class Progress:
    """What the actor's lines report."""

    env_steps: int = 0
    acts: int = 0  # replies whose actions stepped a group
    rollouts: int = 0  # rollouts completed (sent whole to the server)
    outcomes: int = 0  # of those, answered or dropped
    applied: int = 0
    trained_env_steps: int = 0  # env steps of the applied rollouts
    server_steps: int = 0  # the server's Steps that trained them (each counted once)
    abandoned_env_steps: int = 0  # steps of rollouts a broken stream left unfinished
    act_s: list[float] = field(default_factory=list)  # per group's env step: request to actions
    step_s: list[float] = field(default_factory=list)  # per rollout: completed to its outcome
    _last_step: int = -1

    def trained(self, rollout: Rollout, reply: StepReply) -> None:
        """Count an answered rollout: trained when its Step applied updates."""
        if reply.updates_applied <= 0:
            return
        self.applied += 1
        self.trained_env_steps += rollout.actions.size
        if reply.global_step != self._last_step:  # replies come in order: a Step's together
            self.server_steps += 1
            self._last_step = reply.global_step

    def trained_share(self) -> str:
        """`X % trained` of the env steps stepped so far."""
        share = 100 * self.trained_env_steps / self.env_steps if self.env_steps else 0.0
        return f"{share:.1f} % trained"


class StreamActor:
    """The actor's side of its Interact streams: its env groups, the rollouts the server has
    not answered yet, and a reconnect (sending those again as keyed Steps) when a stream
    breaks."""

    def __init__(
        self,
        link: ResilientLink,
        envs: list[EpisodeEnv],
        rollout_len: int,
        obs_dim: int,
        report: Callable[[InteractOutcome, Progress], None],
        synchronous: bool = False,
        settle: Callable[[], None] = lambda: None,
        dropped: Callable[[str], None] = lambda details: None,
    ) -> None:
        self.link, self.envs, self.T, self.D = link, envs, rollout_len, obs_dim
        self.synchronous = synchronous
        self.settle = settle  # after rollouts were sent again: say what became of them
        self.dropped = dropped  # a rollout refused for its policy version: the refusal
        self.sizes = [env.num_envs for env in envs]
        self.report = report
        self.progress = Progress()
        # sequence -> an unanswered rollout, its key and when its last request went
        self._waiting: dict[int, tuple[StepKey, Rollout, float]] = {}
        self._sent_at = [0.0] * len(envs)
        self._open()

    def _open(self) -> None:
        """A new stream from the environments' current observations."""
        self._first = self.link.next_sequence
        self._unroller = Unroller(self.T, self.sizes, self.D)
        client = self.link.client
        self._stream: InteractStream = client.interact(
            self.link.actor_id, self._first, self.T, self.sizes, self.synchronous
        )
        for group, env in enumerate(self.envs):
            self._send(group, env.obs, None)

    def _send(self, group: int, obs: np.ndarray, outcome: EnvStep | None) -> None:
        step = GroupStep(obs) if outcome is None else GroupStep(
            obs=obs, rewards=outcome.rewards, terminated=outcome.terminated,
            truncated=outcome.truncated, final_obs=outcome.final_obs,
            final_obs_index=np.flatnonzero(outcome.truncated), bce_labels=outcome.bce_labels,
            aux_targets=outcome.aux_targets,
        )  # fmt: skip
        for k, rollout in self._unroller.observe(group, step):
            key = self.link.new_key()
            assert key.sequence == self._first + k, "the stream's keys follow the link's"
            self._waiting[key.sequence] = (key, rollout, time.perf_counter())
            self.progress.rollouts += 1
        self._sent_at[group] = time.perf_counter()
        self._stream.send(group, obs, outcome)

    @property
    def unanswered(self) -> int:
        """Rollouts sent whole whose outcome has not come yet."""
        return len(self._waiting)

    @property
    def partial_env_steps(self) -> int:
        """Env steps of rollouts not yet sent whole (a broken stream leaves them)."""
        return self._unroller.env_steps_pending

    @property
    def between_rollouts(self) -> bool:
        """No environment has a step in a rollout not yet sent whole."""
        return self._unroller.env_steps_pending == 0

    def turn(self) -> None:
        """Take one reply: its outcomes, then step its group's environments on its actions and
        send what they observed. A broken stream is reconnected."""
        try:
            reply = self._stream.receive()
        except grpc.RpcError as error:
            if error.code() not in GONE:
                raise
            self._reconnect(error)
            return
        if reply is None:
            raise ActorError("the server closed the Interact stream without being asked")
        self._take(reply)
        group = reply.group
        self.progress.act_s.append(time.perf_counter() - self._sent_at[group])
        self._unroller.acted(group, reply.actions, reply.log_probs, reply.policy_version)
        moved = self.envs[group].step(reply.actions)
        self.progress.acts += 1
        self.progress.env_steps += self.sizes[group]
        self._send(group, moved.obs, moved)

    def catch_up(self) -> None:
        """Between rollouts: end the stream, take the outcome of every rollout sent, and open
        a new stream where the environments are (no rollout is partial: nothing is lost)."""
        self.close()
        self._open()

    def close(self) -> None:
        """Half-close the stream and take every outcome the server still sends."""
        self._stream.close()
        try:
            while (reply := self._stream.receive()) is not None:
                self._take(reply)
        except grpc.RpcError as error:
            if error.code() not in GONE:
                raise
            self.link.reconnect(error)
            self._resend_waiting()
            self.settle()
        self.progress.abandoned_env_steps += self._unroller.env_steps_pending

    def _take(self, reply: InteractReply) -> None:
        for outcome in reply.outcomes:
            key, rollout, completed = self._waiting.pop(outcome.sequence)
            self.progress.step_s.append(time.perf_counter() - completed)
            self.progress.outcomes += 1
            if outcome.reply is not None:
                self.link.answered(key, rollout, outcome.reply)
                self.progress.trained(rollout, outcome.reply)
            elif outcome.code == grpc.StatusCode.FAILED_PRECONDITION and stale(outcome.message):
                self.link.dropped(key, outcome.message)
                self.dropped(outcome.message)
            else:
                code = outcome.code.name if outcome.code else "UNKNOWN"
                raise ActorError(f"the server refused rollout {key}: {code} {outcome.message}")
            self.settle()  # a reply from a state the server went back to: resent its losses
            self.report(outcome, self.progress)

    def _reconnect(self, error: grpc.RpcError) -> None:
        """Wait for the server (`error`: what broke the stream), send the rollouts it never
        answered as keyed Steps (applied once whatever became of them), say what became of
        them, and open a new stream where the environments are."""
        self._stream.cancel()
        self.link.reconnect(error)  # waits through the outage, re-checks the model shape
        self.progress.abandoned_env_steps += self._unroller.env_steps_pending
        self._resend_waiting()
        self.settle()
        self._open()

    def _resend_waiting(self) -> None:
        for sequence in sorted(self._waiting):
            key, rollout, _ = self._waiting.pop(sequence)
            called = time.perf_counter()
            reply = self.link.send_lost(key, rollout)
            self.progress.step_s.append(time.perf_counter() - called)
            self.progress.outcomes += 1
            if reply is not None:
                self.progress.trained(rollout, reply)
                self.report(InteractOutcome(sequence, reply, None, ""), self.progress)


