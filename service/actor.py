"""`trident actor`: N environments in this process, trained by a remote `trident serve`.

The actor runs its environments through one Interact stream (SEED RL's design): per env step a
group of environments sends its observations with the outcome of its previous actions (rewards,
episode ends, final observations of truncated episodes and, for LobSim, the perception labels)
and gets its actions back; the server assembles the time-major rollouts [T, N] and trains each
as a keyed Step, side by side with other actors' rollouts in the learner's own Steps.
`--env-groups G` splits the environments into G groups (Sample Factory's double buffering): one
group steps while another's actions are in flight. The default is one group: where the round trip
is small beside the envs' step (LobSim's markets) there is little to overlap, and a second
group costs the actor CPU for every env step.

`--env lobsim` runs LobSim markets (the `lobsim` settings of --config / --set), `--env
gymnasium:ID` runs `gymnasium.make_vec(ID, num_envs=N, vectorization_mode="sync")` for any env
with Discrete actions and Box observations (flattened); start the server with the same --env
(`trident serve --env ...` sizes its model and fits its settings to the env). The actor reads
the server's status first and stops with a message where the model does not fit its env. What
it sends is the server's run unless flags say otherwise (RunShape): Steps of train.num_envs x
train.rollout_len env steps, until the server's global step reaches train.steps (a server
without train.steps has no end: the actor goes on until it is stopped).

Its calls go through `ResilientLink` (service/client/resilient.py): when the server goes away
(killed, draining, upgraded) the environments wait where they are, the actor reconnects with
backoff (`--reconnect-timeout`), reads the model shape again, and goes on; every Step carries
an idempotency key, and Steps the server lost with its state are sent again (or dropped and
counted when they are more than train.max_policy_lag versions old). `OutageLines` tells the
operator as it happens: a line when the server goes away (what the actor keeps and how long
it waits), one per reconnect attempt (then one each ATTEMPT_LINE_S once the backoff stops
growing), and one when the server is back, with what was sent again and what became of it.
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field, replace

import grpc
import numpy as np

from service import logs
from service.api.trident.v1 import trainer_pb2 as pb
from service.client.client import StepReply, TridentClient
from service.client.interact import InteractOutcome, InteractReply, InteractStream
from service.client.resilient import (
    GONE,
    MAX_WAIT_S,
    LinkCounts,
    Resends,
    ResilientLink,
    ahead,
    periodic_checkpoints,
    stale,
)
from service.config import LobsimConfig
from service.envs import EnvDims, EpisodeEnv, env_dims, open_env
from service.errors import TridentError
from service.signals import stop_signals
from service.step_ledger import StepKey
from service.trainer.model import HEADS
from service.types import Rollout
from service.unroll import GroupStep, Unroller
from service.vector_env import EnvStep


class ActorError(TridentError):
    """The actor cannot run: the server's model does not fit its env, or the server is
    inference-only."""


def check_dims(status: pb.GetStatusResponse, dims: EnvDims, env: str) -> None:
    """Stop unless the server trains and its model fits the env."""
    if status.inference_only:
        raise ActorError("the server is inference-only (started from a checkpoint): no Steps")
    model = json.loads(status.config_json)["model"]
    wanted = {"obs_dim": dims.obs_dim, "num_actions": dims.num_actions}
    if dims.aux_dim is not None:
        wanted["aux_dim"] = dims.aux_dim
    wrong = {k: v for k, v in wanted.items() if model[k] != v}
    if wrong:
        said = "; ".join(f"model.{k} = {model[k]}, the env needs {v}" for k, v in wrong.items())
        fix = " ".join(f"--set model.{k}={v}" for k, v in wrong.items())
        raise ActorError(
            f"the server's model does not fit --env {env}: {said}. Start the server with "
            f"--env {env} (it sizes the model for the env), or add {fix}"
        )


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


ATTEMPT_LINE_S = 10.0  # once the backoff is at MAX_WAIT_S: at most one attempt line this often


class OutageLines:
    """The actor's lines about its server's outages (a LinkWatcher of its ResilientLink):
    gone, each reconnect attempt, back. The back line waits for `settle`, which the actor
    calls once it has sent again what the outage left unanswered, so that it can say what
    became of those; `settle` also tells of rollouts sent again with no outage (a reply from
    a state the server went back to by Restore)."""

    def __init__(
        self, target: str, reconnect_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.target, self.reconnect_s, self.clock = target, reconnect_s, clock
        self.starting = True  # no status yet: the actor's first call
        self.link: ResilientLink | None = None
        self.actor: StreamActor | None = None
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
        unanswered = self.actor.unanswered if self.actor is not None else 0
        unconfirmed = self.link.unconfirmed if self.link is not None else 0
        partial = self.actor.partial_env_steps if self.actor is not None else 0
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
        if self.link is None:
            return
        again = self.link.counts.again
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


def first_status(link: ResilientLink, lines: OutageLines) -> pb.GetStatusResponse:
    """The server's status at the actor's start. An actor may start while its server starts
    or restarts (a fleet and its server deployed together): then it says so on one line and
    waits as through any outage, up to --reconnect-timeout, a line per attempt."""
    try:
        status = link.client.status()
    except grpc.RpcError as error:
        if error.code() not in GONE:
            raise
        status = link.wait_for_server(error)
    lines.starting = False
    return status


GROUP_SEED_STRIDE = 2**20  # group g's environments are seeded from seed + g * this


def group_sizes(num_envs: int, groups: int) -> list[int]:
    """`num_envs` split into `groups` sizes as equal as they can be, larger first."""
    return [num_envs // groups + (g < num_envs % groups) for g in range(groups)]


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


@dataclass(frozen=True)
class RunShape:
    """What an actor sends: rollouts of `rollout_len` x `num_envs` env steps, `rollouts` of
    them (None: no count of its own), until the server's global step reaches `until_step`
    (None: no such end; with neither, until it is stopped). `per_step`: how many of its
    rollouts make one of the server's Steps (train.num_envs columns at least) where it sends
    alone."""

    num_envs: int
    rollout_len: int
    rollouts: int | None
    until_step: int | None
    per_step: int = 1

    @classmethod
    def of(
        cls,
        status: pb.GetStatusResponse,
        num_envs: int | None,
        rollout_len: int | None,
        steps: int | None,
    ) -> RunShape:
        """The flags given, the rest from the server's run: train.num_envs and rollout_len
        (the Steps `trident train` makes), until its global step reaches train.steps (the end
        of its learning-rate schedule), whatever this actor's share of each Step and however
        many actors share it; a server without train.steps runs with no end, and so does the
        actor. `steps` (--steps) is a count of this actor's rollouts instead."""
        train = json.loads(status.config_json)["train"]
        until = None
        if steps is None and train["steps"]:
            until = train["steps"]
            if status.global_step >= until:
                raise ActorError(
                    f"the server's run has ended: its global step {status.global_step} has "
                    f"reached train.steps = {until}; --steps N sends N more rollouts (at the "
                    "schedule's last rate), or start the server with a larger train.steps"
                )
        num_envs = num_envs or train["num_envs"]
        per_step = max(1, -(-train["num_envs"] // num_envs))  # ceil: a Step's columns at least
        return cls(num_envs, rollout_len or train["rollout_len"], steps, until, per_step)

    def header(self, env: str, dims: EnvDims, sizes: list[int], seed: int, actor_id: str) -> str:
        """The actor's first line: what it runs, how long, and who it is."""
        groups = ("in one group" if len(sizes) == 1 else
                  f"in {len(sizes)} groups ({' + '.join(map(str, sizes))})")  # fmt: skip
        if self.rollouts is not None:
            end = f"{plural(self.rollouts, 'rollout')}, then exit"
        elif self.until_step is not None:
            end = f"until the server's global step reaches {self.until_step} (its train.steps)"
        else:
            end = "until stopped (the server's run has no end: no train.steps)"
        return (f"{HEADER}{plural(self.num_envs, f'{env} environment')} {groups}, rollouts of "
                f"{self.rollout_len} steps each, {end} | model obs_dim {dims.obs_dim}, "
                f"{dims.num_actions} actions | seed {seed} | actor id {actor_id}")  # fmt: skip


HEADER = "trident actor: runs "  # how the actor's first line starts (a bench waits for it)
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


def run_actor(
    client: TridentClient,
    env: str,
    lobsim: LobsimConfig,
    *,
    num_envs: int | None,
    steps: int | None,
    rollout_len: int | None,
    seed: int,
    log_every: int,
    duration_s: float | None = None,
    reconnect_s: float = 300.0,
    env_groups: int = 1,
    synchronous: bool = False,
    wait_checkpoint: bool = False,
) -> int:
    """Send rollouts of `rollout_len` x `num_envs` env steps (each None: as the server's run,
    RunShape.of), `steps` of them or (None) until the server's global step reaches its
    train.steps, or until the first rollout boundary `duration_s` after the start, through an
    Interact stream, the envs in `env_groups` groups (`synchronous`: a rollout's first actions
    wait for the previous rollout's Step); print progress, then a `done:` summary line. With
    `wait_checkpoint`, wait (up to `reconnect_s`) until a checkpoint holds every applied Step
    before it. A server gone for longer than `reconnect_s` stops the actor (ServerGone).
    SIGINT or SIGTERM stops it at once: the partial rollout abandoned, the Steps sent
    answered, the summary printed, exit code 130."""
    for name, value in (
        ("--num-envs", num_envs), ("--steps", steps), ("--rollout-len", rollout_len),
        ("--log-every", log_every), ("--env-groups", env_groups),
    ):  # fmt: skip
        if value is not None and value < 1:
            raise ActorError(f"{name}: expected a positive integer, got {value}")
    seeds = 2**63 - env_groups * GROUP_SEED_STRIDE  # every group's seed fits in 63 bits
    if not 0 <= seed < seeds:
        raise ActorError(f"--seed: expected an integer in [0, {seeds}), got {seed}")
    if duration_s is not None and not duration_s > 0:
        raise ActorError(f"--duration: expected a positive number of seconds, got {duration_s}")
    if not reconnect_s > 0:
        raise ActorError(f"--reconnect-timeout: expected a positive number, got {reconnect_s}")
    dims = env_dims(env, lobsim)
    lines = OutageLines(client.target, reconnect_s)
    link = ResilientLink(client, lambda status: check_dims(status, dims, env),
                         reconnect_s=reconnect_s, watcher=lines)  # fmt: skip
    lines.link = link
    status = first_status(link, lines)
    check_dims(status, dims, env)
    shape = RunShape.of(status, num_envs, rollout_len, steps)
    if env_groups > shape.num_envs:
        raise ActorError(f"--env-groups: expected at most --num-envs ({shape.num_envs}), got "
                         f"{env_groups}")  # fmt: skip
    sizes = group_sizes(shape.num_envs, env_groups)
    count, until = shape.rollouts, shape.until_step
    with ExitStack() as opened:
        envs = [
            opened.enter_context(open_env(env, size, lobsim, seed + group * GROUP_SEED_STRIDE))[0]
            for group, size in enumerate(sizes)
        ]
        print(shape.header(env, dims, sizes, seed, link.actor_id), flush=True)
        started = time.perf_counter()
        rate = Rate(started)
        warned = logs.FirstOfKind()
        drops = DropLines()
        server_step = [status.global_step]  # as the latest reply has it
        of_count = "" if count is None else f"/{count}"
        of_until = "" if until is None else f"/{until}"
        ended = [False]  # the line of the reply that reached the server's end is printed

        def report(outcome: InteractOutcome, progress: Progress) -> None:
            reply = outcome.reply
            for warning in warned.new(reply.warnings if reply else []):
                print(f"trident actor: the server warns (shown once): {warning}", flush=True)
            if reply is None:
                return
            server_step[0] = reply.global_step
            end = until is not None and reply.global_step >= until and not ended[0]
            ended[0] = ended[0] or end
            if progress.outcomes % log_every and not (end or progress.outcomes == count):
                return
            returns = [r for vec_env in envs for r in vec_env.take_returns()]
            episodes = f"{np.mean(returns):.2f} ({len(returns)})" if returns else "n/a"
            losses = " ".join(f"{k} {reply.losses[k]:.3f}" for k in loss_columns(reply.losses))
            skipped = f" | skipped: {reply.skip_reason}" if reply.skipped else ""
            print(
                f"rollout {progress.outcomes:>5}{of_count} | global step {reply.global_step}"
                f"{of_until} | {rate.since(time.perf_counter(), progress.env_steps)} | "
                f"episode return {episodes} | {losses}{skipped}{drops.counts(link.counts)}",
                flush=True,
            )

        with stop_signals() as stopping:
            actor = StreamActor(link, envs, shape.rollout_len, dims.obs_dim, report, synchronous,
                                lines.settle, drops.dropped)  # fmt: skip
            lines.actor = actor
            while (count is None or actor.progress.rollouts < count) and not stopping:
                if until is not None and actor.between_rollouts:
                    if server_step[0] >= until:
                        break  # the server's run has ended (other actors' Steps count too)
                    in_flight = -(-actor.unanswered // shape.per_step)  # Steps they make
                    if server_step[0] + in_flight >= until:
                        # What is in flight may end the run: its outcomes before more rollouts
                        actor.catch_up()
                        continue
                late = duration_s is not None and time.perf_counter() - started >= duration_s
                if late and actor.between_rollouts:
                    break
                actor.turn()
            actor.close()
            if wait_checkpoint and not stopping:
                link.wait_durable(reconnect_s)
                lines.settle()
            progress, counts = actor.progress, link.counts
            seconds = time.perf_counter() - started
            print(
                f"done: {progress.outcomes} rollouts ({progress.applied} trained in "
                f"{progress.server_steps} Steps, {counts.dropped_behind} dropped behind the "
                f"policy lag, {counts.dropped_ahead} dropped ahead of the server's state), "
                f"{progress.acts} Acts, {progress.env_steps} env steps "
                f"({progress.trained_share()}, {progress.abandoned_env_steps} in unfinished "
                f"rollouts) in {seconds:.1f} s at {progress.env_steps / seconds:.0f} env "
                f"steps/s | global step {server_step[0]}{of_until} | "
                f"{latency_ms('Step', progress.step_s)} | {latency_ms('Act', progress.act_s)} | "
                f"{counts.rollouts} rollouts, {counts.resent} resent, {counts.replayed} replayed, "
                f"{counts.reconnects} reconnects | {durability(counts, status)}",
                flush=True,
            )
            if stopping:
                print(f"trident actor: stopped by {stopping[0]}; the partial rollout's env "
                      "steps were not sent. Start it again to go on: a new actor, its "
                      "environments from their first observations", flush=True)  # fmt: skip
                return 130
    return 0


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
