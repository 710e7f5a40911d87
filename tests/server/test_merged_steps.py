"""The learner's Step through a real server: two Interact streams' rollouts train side by side as
one Step, equal to a bare Trainer's Step on them; their keys are applied together, each reply
names that Step, a checkpoint's ledger holds both, and a key sent again is answered from it. A
rollout too old to train on is refused on its stream, counted by reason, and said in the log
once per stream and reason, then summed when the stream ends."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
from conftest import running_server, small_config, wait_until

from service.client.client import TridentClient
from service.client.interact import InteractOutcome, InteractStream
from service.step_ledger import StepKey
from service.testing.serverproc import scrape, value
from service.trainer.trainer import Trainer
from service.types import Rollout
from service.unroll import GroupStep, Unroller
from service.vector_env import EnvStep
from tests.server.test_interact import D, ScriptedEnv

T, N = 4, 3
WAIT_S = 30.0  # for a condition that holds within a Step or two on any machine


class Stream:
    """An actor's side of one Interact stream of one group, driven a request at a time, with its
    own copy of each rollout it completes (the server's Unroller's twin)."""

    def __init__(self, client: TridentClient, actor: str, seed: int, synchronous: bool = False):
        self.env = ScriptedEnv(seed, N)
        self.stream: InteractStream = client.interact(actor, 0, T, [N], synchronous)
        self.unroller = Unroller(T, [N], D)
        self.rollouts: list[Rollout] = []
        self.outcomes: list[InteractOutcome] = []
        self._send(self.env.obs, None)

    def _send(self, obs: np.ndarray, moved: EnvStep | None) -> None:
        step = GroupStep(obs) if moved is None else GroupStep(
            obs, moved.rewards, moved.terminated, moved.truncated, moved.final_obs,
            np.flatnonzero(moved.truncated), moved.bce_labels, moved.aux_targets)  # fmt: skip
        self.rollouts += [rollout for _, rollout in self.unroller.observe(0, step)]
        self.stream.send(0, obs, moved)

    def turns(self, count: int) -> None:
        """Take `count` replies, each answered with the env's next step."""
        for _ in range(count):
            reply = self.stream.receive()
            assert reply is not None and reply.group == 0
            self.outcomes += reply.outcomes
            self.unroller.acted(0, reply.actions, reply.log_probs, reply.policy_version)
            moved = self.env.step(reply.actions)
            self._send(moved.obs, moved)

    def close(self) -> list[InteractOutcome]:
        self.stream.close()
        while (reply := self.stream.receive()) is not None:
            self.outcomes += reply.outcomes
        return self.outcomes


def test_two_streams_rollouts_train_as_one_step(tmp_path: Path, seed: int) -> None:
    settings = (f"train.num_envs={2 * N}",)
    with running_server(tmp_path, *settings) as server, TridentClient(server.target) as client:
        first, second = Stream(client, "actor-a", seed), Stream(client, "actor-b", seed + 1)

        # Side by side, so that the first is still producing (its next rollout due) when the
        # second's arrives however slow this machine is: the Step waits for it, and is full.
        # Each rollout is seen queued before the next goes: the streams' sends race, and the
        # Step's columns follow the order its rollouts arrived in (the twin's below).
        def queued(depth: int) -> Callable[[], bool]:
            def check() -> bool:
                status = client.status()
                return status.step_queue_depth == depth or status.global_step == 1

            return check

        first.turns(T - 1)
        second.turns(T - 1)
        first.turns(1)
        wait_until(queued(1), WAIT_S, "the first stream's rollout queued")
        second.turns(1)  # the second fills the Step: it trains now
        # A half-closed stream waits for its Steps and so is no longer expected: close only once
        # the second's rollout is in (queued beside the first's, or trained with it).
        wait_until(queued(2), WAIT_S, "the second stream's rollout in")
        outcomes = first.close() + second.close()
        assert [(o.sequence, o.code) for o in outcomes] == [(0, None), (0, None)]
        replies = [o.reply for o in outcomes]
        assert [r.global_step for r in replies] == [1, 1]
        assert replies[0].losses == replies[1].losses
        status = client.status()
        assert status.global_step == 1 and status.replay_size == 2 * T * N

        twin = Trainer(small_config(*settings))
        merged = Rollout.side_by_side(first.rollouts + second.rollouts, np.empty)
        assert merged.num_envs == 2 * N
        losses = twin.step(merged).losses  # float64 here, float32 on the wire
        assert {k: np.float32(v) for k, v in losses.items()} == replies[0].losses
        assert twin.param_digest() == status.param_digest

        saved = client.checkpoint("merged")
        ledger = json.loads((server.checkpoint_dir / saved.name / "ledger.json").read_text())
        assert {(e["actor"], e["sequence"], e["result"]["global_step"])
                for e in ledger["applied"]} == {("actor-a", 0, 1), ("actor-b", 0, 1)}  # fmt: skip
        again = client.step(second.rollouts[0], key=StepKey("actor-b", 0))
        assert again.replayed and again.global_step == 1 and again.losses == replies[1].losses
        assert client.status().param_digest == status.param_digest
        metrics = scrape(server)
    assert value(metrics, "trident_step_rollouts_sum") == 2
    assert value(metrics, "trident_step_rollouts_count") == 1
    assert value(metrics, "trident_rollouts_total") == 2
    assert value(metrics, "trident_samples_total") == 2 * T * N


def test_a_rollout_too_old_is_dropped_counted_and_said_once_per_stream(
    tmp_path: Path, seed: int
) -> None:
    """max_policy_lag 0: each of the slow stream's rollouts was acted on before another
    stream's Step ran in its middle, so both are refused as behind; the log says so at the
    first, and with the count when the stream ends."""
    settings = ("train.max_policy_lag=0", f"train.num_envs={N}", "server.step_max_wait_ms=50")
    with running_server(tmp_path, *settings) as server, TridentClient(server.target) as client:
        slow = Stream(client, "slow", seed)
        for rollout in range(2):
            slow.turns(T - 1)
            quick = Stream(client, f"quick-{rollout}", seed + 1 + rollout, synchronous=True)
            quick.turns(T)  # its rollout trains in the slow one's middle
            assert [o.reply.global_step for o in quick.close()] == [rollout + 1]
            slow.turns(1)  # the slow rollout, acted on at the version before: behind
        outcomes = slow.close()
        assert [(o.sequence, o.code.name if o.code else None) for o in outcomes] == [
            (0, "FAILED_PRECONDITION"), (1, "FAILED_PRECONDITION")]  # fmt: skip
        assert all("older than the lag allows" in o.message for o in outcomes)
        metrics = scrape(server)
        said = server.events("rollout dropped")
        summed = server.events("stream ended with rollouts dropped")
    assert value(metrics, "trident_rollouts_dropped_total", reason="behind") == 2
    assert value(metrics, "trident_rollouts_dropped_total", reason="ahead") == 0
    assert value(metrics, "trident_rollouts_total") == 4
    assert [(e["actor"], e["reason"], e["sequence"]) for e in said] == [("slow", "behind", 0)]
    assert [(e["actor"], e["dropped"]) for e in summed] == [("slow", {"behind": 2})]
