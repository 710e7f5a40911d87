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
from contextlib import ExitStack
from dataclasses import dataclass

import grpc
import numpy as np

from service import logs
from service.actor.lines import (
    DropLines,
    OutageLines,
    Rate,
    Sending,
    durability,
    latency_ms,
    loss_columns,
    plural,
)
from service.actor.stream import ActorError, Progress, StreamActor
from service.api.trident.v1 import trainer_pb2 as pb
from service.client.client import TridentClient
from service.client.interact import InteractOutcome
from service.client.resilient import GONE, Resends, ResilientLink
from service.config import LobsimConfig
from service.envs import EnvDims, EpisodeEnv, env_dims, open_env
from service.signals import stop_signals


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


@dataclass(frozen=True)
class ActorOptions:
    """How an actor runs (`trident actor`'s flags): rollouts of `rollout_len` x `num_envs` env
    steps (each None: as the server's run, RunShape.of), `steps` of them or (None) until the
    server's global step reaches its train.steps, or until the first rollout boundary
    `duration_s` after the start; the envs in `env_groups` groups seeded from `seed`
    (`synchronous`: a rollout's first actions wait for the previous rollout's Step); a line
    every `log_every` outcomes; a server gone for longer than `reconnect_s` stops the actor;
    `wait_checkpoint`: at the end, wait until a checkpoint holds every applied Step."""

    num_envs: int | None = None
    steps: int | None = None
    rollout_len: int | None = None
    seed: int = 0
    log_every: int = 10
    duration_s: float | None = None
    reconnect_s: float = 300.0
    env_groups: int = 1
    synchronous: bool = False
    wait_checkpoint: bool = False

    def check(self) -> None:
        """ActorError naming the flag where a value is out of its range."""
        for name, value in (
            ("--num-envs", self.num_envs), ("--steps", self.steps),
            ("--rollout-len", self.rollout_len), ("--log-every", self.log_every),
            ("--env-groups", self.env_groups),
        ):  # fmt: skip
            if value is not None and value < 1:
                raise ActorError(f"{name}: expected a positive integer, got {value}")
        seeds = 2**63 - self.env_groups * GROUP_SEED_STRIDE  # every group's seed fits 63 bits
        if not 0 <= self.seed < seeds:
            raise ActorError(f"--seed: expected an integer in [0, {seeds}), got {self.seed}")
        if self.duration_s is not None and not self.duration_s > 0:
            raise ActorError(f"--duration: expected a positive number of seconds, got "
                             f"{self.duration_s}")  # fmt: skip
        if not self.reconnect_s > 0:
            raise ActorError(f"--reconnect-timeout: expected a positive number, got "
                             f"{self.reconnect_s}")  # fmt: skip


class Actor:
    """`trident actor`: its link to the server (ResilientLink, with its outage lines as the
    watcher), and `run`, the loop that reads the server's run, opens the env groups and turns
    the Interact stream (StreamActor) until the run ends, with a progress line every
    `log_every` outcomes and a `done:` summary line."""

    def __init__(
        self, client: TridentClient, env: str, lobsim: LobsimConfig, options: ActorOptions
    ) -> None:
        options.check()
        self.env, self.lobsim, self.options = env, lobsim, options
        self.dims = env_dims(env, lobsim)
        self.lines = OutageLines(client.target, options.reconnect_s, actor=self)
        self.link = ResilientLink(client, self.check_model, reconnect_s=options.reconnect_s,
                                  watcher=self.lines)  # fmt: skip
        self.stream: StreamActor | None = None  # the env groups' stream, while they run
        self.drops = DropLines()
        self.warned = logs.FirstOfKind()
        self.server_step = 0  # as the latest reply has it
        self.ended = False  # the line of the reply that reached the server's end is printed

    def check_model(self, status: pb.GetStatusResponse) -> None:
        check_dims(status, self.dims, self.env)

    # What the outage lines tell of (Sending).
    @property
    def unanswered(self) -> int:
        return self.stream.unanswered if self.stream is not None else 0

    @property
    def unconfirmed(self) -> int:
        return self.link.unconfirmed

    @property
    def partial_env_steps(self) -> int:
        return self.stream.partial_env_steps if self.stream is not None else 0

    @property
    def resends(self) -> Resends:
        return self.link.counts.again

    def run(self) -> int:
        """Send what the options say; 0, or 130 where SIGINT or SIGTERM stopped it at once
        (the partial rollout abandoned, the Steps sent answered, the summary printed)."""
        options = self.options
        status = first_status(self.link, self.lines)
        self.check_model(status)
        shape = RunShape.of(status, options.num_envs, options.rollout_len, options.steps)
        if options.env_groups > shape.num_envs:
            raise ActorError(f"--env-groups: expected at most --num-envs ({shape.num_envs}), "
                             f"got {options.env_groups}")  # fmt: skip
        sizes = group_sizes(shape.num_envs, options.env_groups)
        self.server_step = status.global_step
        with ExitStack() as opened:
            envs = [
                opened.enter_context(open_env(self.env, size, self.lobsim,
                                              options.seed + group * GROUP_SEED_STRIDE))[0]
                for group, size in enumerate(sizes)
            ]  # fmt: skip
            print(shape.header(self.env, self.dims, sizes, options.seed, self.link.actor_id),
                  flush=True)  # fmt: skip
            started = time.perf_counter()
            report = Report(self, shape, envs, Rate(started))
            with stop_signals() as stopping:
                self.stream = StreamActor(self.link, envs, shape.rollout_len, self.dims.obs_dim,
                                          report, options.synchronous, self.lines.settle,
                                          self.drops.dropped)  # fmt: skip
                self.loop(shape, started, stopping)
                self.stream.close()
                if options.wait_checkpoint and not stopping:
                    self.link.wait_durable(options.reconnect_s)
                    self.lines.settle()
                print(self.summary(shape, status, time.perf_counter() - started), flush=True)
                if stopping:
                    print(f"trident actor: stopped by {stopping[0]}; the partial rollout's env "
                          "steps were not sent. Start it again to go on: a new actor, its "
                          "environments from their first observations", flush=True)  # fmt: skip
                    return 130
        return 0

    def loop(self, shape: RunShape, started: float, stopping: list[str]) -> None:
        """Turn the stream until the rollouts are sent, the server's run ends, the duration
        passes at a rollout boundary, or a signal comes."""
        stream, count, until = self.stream, shape.rollouts, shape.until_step
        assert stream is not None
        duration_s = self.options.duration_s
        while (count is None or stream.progress.rollouts < count) and not stopping:
            if until is not None and stream.between_rollouts:
                if self.server_step >= until:
                    break  # the server's run has ended (other actors' Steps count too)
                in_flight = -(-stream.unanswered // shape.per_step)  # Steps they make
                if self.server_step + in_flight >= until:
                    # What is in flight may end the run: its outcomes before more rollouts
                    stream.catch_up()
                    continue
            late = duration_s is not None and time.perf_counter() - started >= duration_s
            if late and stream.between_rollouts:
                break
            stream.turn()

    def summary(self, shape: RunShape, status: pb.GetStatusResponse, seconds: float) -> str:
        """The `done:` line: rollouts and their fates, env steps, rates, latencies, resends."""
        assert self.stream is not None
        progress, counts = self.stream.progress, self.link.counts
        of_until = "" if shape.until_step is None else f"/{shape.until_step}"
        return (
            f"done: {progress.outcomes} rollouts ({progress.applied} trained in "
            f"{progress.server_steps} Steps, {counts.dropped_behind} dropped behind the "
            f"policy lag, {counts.dropped_ahead} dropped ahead of the server's state), "
            f"{progress.acts} Acts, {progress.env_steps} env steps "
            f"({progress.trained_share()}, {progress.abandoned_env_steps} in unfinished "
            f"rollouts) in {seconds:.1f} s at {progress.env_steps / seconds:.0f} env "
            f"steps/s | global step {self.server_step}{of_until} | "
            f"{latency_ms('Step', progress.step_s)} | {latency_ms('Act', progress.act_s)} | "
            f"{counts.rollouts} rollouts, {counts.resent} resent, {counts.replayed} replayed, "
            f"{counts.reconnects} reconnects | {durability(counts, status)}"
        )


@dataclass
class Report:
    """The actor's progress lines, called with each outcome the stream takes: a warning the
    server sends is said once; every `log_every` outcomes (and at the run's end) a line of the
    server's global step, the rate, the episodes' mean return, the losses and the drops."""

    actor: Actor
    shape: RunShape
    envs: list[EpisodeEnv]
    rate: Rate

    def __call__(self, outcome: InteractOutcome, progress: Progress) -> None:
        actor, reply = self.actor, outcome.reply
        for warning in actor.warned.new(reply.warnings if reply else []):
            print(f"trident actor: the server warns (shown once): {warning}", flush=True)
        if reply is None:
            return
        count, until = self.shape.rollouts, self.shape.until_step
        actor.server_step = reply.global_step
        end = until is not None and reply.global_step >= until and not actor.ended
        actor.ended = actor.ended or end
        if progress.outcomes % actor.options.log_every and not (end or progress.outcomes == count):
            return
        returns = [r for vec_env in self.envs for r in vec_env.take_returns()]
        episodes = f"{np.mean(returns):.2f} ({len(returns)})" if returns else "n/a"
        losses = " ".join(f"{k} {reply.losses[k]:.3f}" for k in loss_columns(reply.losses))
        skipped = f" | skipped: {reply.skip_reason}" if reply.skipped else ""
        of_count = "" if count is None else f"/{count}"
        of_until = "" if until is None else f"/{until}"
        print(
            f"rollout {progress.outcomes:>5}{of_count} | global step {reply.global_step}"
            f"{of_until} | {self.rate.since(time.perf_counter(), progress.env_steps)} | "
            f"episode return {episodes} | {losses}{skipped}"
            f"{actor.drops.counts(actor.link.counts)}",
            flush=True,
        )


def run_actor(client: TridentClient, env: str, lobsim: LobsimConfig, options: ActorOptions) -> int:
    """`trident actor`: an Actor of these options, run."""
    return Actor(client, env, lobsim, options).run()




__all__ = ["GROUP_SEED_STRIDE", "HEADER", "Actor", "ActorError", "ActorOptions", "DropLines",
           "OutageLines", "Rate", "Sending", "StreamActor", "check_dims", "group_sizes",
           "run_actor"]  # fmt: skip
