"""Interact through a real server: with one group it trains what Act x T then Step would, byte
for byte; the rollouts it assembles from two interleaved groups are the groups' own steps, in
their columns; and a malformed request is refused naming its field, changing nothing."""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import pytest
from conftest import running_server, wait_until

from service.client.client import TridentClient
from service.errors import InvalidInput
from service.step_ledger import StepKey
from service.testing.serverproc import scrape, trident_cli, value
from service.unroll import GroupStep, Unroller
from service.vector_env import EnvStep, collect_rollout

T, N, D, K = 4, 5, 6, 3  # the small model of conftest.SMALL: obs_dim 6, aux_dim 3


class ScriptedEnv:
    """N environments whose every step is drawn from `seed` alone: obs, rewards, terminations,
    truncations with final observations, perception labels."""

    def __init__(self, seed: int, num_envs: int = N) -> None:
        self.rng = np.random.default_rng(seed)
        self.num_envs = num_envs
        self.obs = self.rng.standard_normal((num_envs, D)).astype(np.float32)

    def step(self, actions: np.ndarray) -> EnvStep:
        n, rng = self.num_envs, self.rng
        truncated = rng.random(n) < 0.2
        terminated = (rng.random(n) < 0.2) & ~truncated
        final = rng.standard_normal((int(truncated.sum()), D)).astype(np.float32)
        self.obs = (rng.standard_normal((n, D)) + 0.01 * actions[:, None]).astype(np.float32)
        return EnvStep(
            obs=self.obs,
            rewards=rng.standard_normal(n).astype(np.float32),
            terminated=terminated,
            truncated=truncated,
            final_obs=final,
            bce_labels=rng.integers(0, 2, n).astype(np.uint8),
            aux_targets=rng.standard_normal((n, K)).astype(np.float32),
        )


@pytest.mark.parametrize("front_ends", [0, 2])
def test_one_synchronous_group_trains_what_act_then_step_would(
    tmp_path: Path, seed: int, front_ends: int
) -> None:
    """Also with the stream in a front-end process of its own (server.front_ends = 2) and the
    twin's Steps in one process: the handoff changes nothing of what is trained."""
    rollouts = 3
    with (
        running_server(tmp_path / "a", f"server.front_ends={front_ends}") as streamed,
        running_server(tmp_path / "b") as unary,
        TridentClient(streamed.target) as one, TridentClient(unary.target) as other,
    ):  # fmt: skip
        env = ScriptedEnv(seed)
        stream = one.interact("actor-a", 10, T, [N], synchronous=True)
        stream.send(0, env.obs, None)
        outcomes = []
        for _ in range(rollouts * T):  # the last request closes the last rollout
            reply = stream.receive()
            assert reply is not None and reply.group == 0
            outcomes.extend(reply.outcomes)
            moved = env.step(reply.actions)
            stream.send(0, moved.obs, moved)
        stream.close()
        while (reply := stream.receive()) is not None:
            outcomes.extend(reply.outcomes)

        twin = ScriptedEnv(seed)
        act = lambda obs: other.act(obs)  # noqa: E731
        replies = [other.step(collect_rollout(act, twin, T), key=StepKey("actor-b", i))
                   for i in range(rollouts)]  # fmt: skip
        assert [o.sequence for o in outcomes] == [10, 11, 12]
        for outcome, reply in zip(outcomes, replies, strict=True):
            assert outcome.reply is not None, outcome
            assert outcome.reply.losses == reply.losses
            assert outcome.reply.global_step == reply.global_step
        assert one.status().param_digest == other.status().param_digest
        assert one.status().global_step == rollouts


def test_two_groups_fill_their_own_columns(rng: np.random.Generator) -> None:
    sizes = [3, 2]
    unroller = Unroller(T, sizes, D)
    envs = [ScriptedEnv(int(rng.integers(2**31)), n) for n in sizes]
    steps: list[list[tuple[np.ndarray, EnvStep | None, np.ndarray]]] = [[], []]
    done = []
    for group, env in enumerate(envs):
        assert unroller.observe(group, GroupStep(env.obs)) == []
    for turn in range(2 * T):
        for group in (1, 0) if turn % 3 else (0, 1):  # the groups' replies in either order
            env = envs[group]
            actions = rng.integers(0, 9, sizes[group]).astype(np.int32)
            unroller.acted(group, actions, -np.ones(sizes[group], np.float32), turn)
            before = env.obs
            moved = env.step(actions)
            steps[group].append((before, moved, actions))
            done += unroller.observe(group, GroupStep(
                moved.obs, moved.rewards, moved.terminated, moved.truncated, moved.final_obs,
                np.flatnonzero(moved.truncated), moved.bce_labels, moved.aux_targets))  # fmt: skip
    assert [k for k, _ in done] == [0, 1]
    for k, rollout in done:
        assert rollout.policy_version == k * T
        for group, lo in ((0, 0), (1, sizes[0])):
            cols = slice(lo, lo + sizes[group])
            mine = steps[group][k * T : (k + 1) * T]
            np.testing.assert_array_equal(rollout.obs[:T, cols], [s[0] for s in mine])
            np.testing.assert_array_equal(rollout.obs[T, cols], mine[-1][1].obs)
            np.testing.assert_array_equal(rollout.actions[:, cols], [s[2] for s in mine])
            np.testing.assert_array_equal(rollout.rewards[:, cols], [s[1].rewards for s in mine])
            np.testing.assert_array_equal(rollout.aux_targets[:, cols],
                                          [s[1].aux_targets for s in mine])  # fmt: skip
        finals = {int(i): row for i, row in zip(rollout.final_obs_index, rollout.final_obs,
                                                strict=True)}  # fmt: skip
        assert sorted(finals) == np.flatnonzero(rollout.truncated.reshape(-1)).tolist()
        for t in range(T):
            for group, lo in ((0, 0), (1, sizes[0])):
                moved = steps[group][k * T + t][1]
                for j, n in enumerate(np.flatnonzero(moved.truncated)):
                    np.testing.assert_array_equal(finals[t * sum(sizes) + lo + n],
                                                  moved.final_obs[j])  # fmt: skip


@pytest.mark.parametrize(
    ("start", "obs_shape", "field"),
    [(False, (N, D), "start"), (True, (N, D + 1), "obs"), (True, (0, D), "obs")],
)
def test_a_malformed_request_is_refused_naming_its_field(
    tmp_path: Path, rng: np.random.Generator, start: bool, obs_shape: tuple, field: str
) -> None:
    from service.api.tensors import encode
    from service.api.trident.v1 import trainer_pb2 as pb

    request = pb.InteractRequest(obs=encode(rng.standard_normal(obs_shape).astype(np.float32)))
    if start:
        request.start.CopyFrom(pb.InteractStart(actor_id="a", rollout_len=T, group_envs=[N]))
    with running_server(tmp_path) as server, TridentClient(server.target) as client:
        with pytest.raises(grpc.RpcError) as caught:
            list(client.stub.Interact(iter([request])))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert caught.value.details().startswith(field), caught.value.details()
        assert client.status().global_step == 0


def test_actors_on_the_host_reach_the_server_over_a_unix_socket(
    tmp_path: Path, seed: int
) -> None:
    path = tmp_path / "trident.sock"
    with running_server(tmp_path, extra_args=("--unix-socket", str(path))) as server:
        assert server.events("serving")[0]["unix_socket"] == str(path)
        with TridentClient(f"unix:{path}") as client:
            env = ScriptedEnv(seed)
            stream = client.interact("local", 0, T, [N])
            stream.send(0, env.obs, None)
            for _ in range(T):
                reply = stream.receive()
                assert reply is not None
                moved = env.step(reply.actions)
                stream.send(0, moved.obs, moved)
            metrics = scrape(server)
            assert value(metrics, "trident_interact_streams") == 1
            # the T requests answered were timed in the handler (the last sent may be as well)
            timed = value(metrics, "trident_interact_request_duration_seconds_count")
            assert T <= timed <= T + 1
            stream.close()
            outcomes = []
            while (reply := stream.receive()) is not None:
                outcomes.extend(reply.outcomes)
            assert [o.sequence for o in outcomes] == [0] and outcomes[0].reply is not None
            assert client.status().global_step == 1
            wait_until(lambda: value(scrape(server), "trident_interact_streams") == 0, 10,
                       "the closed stream uncounted")  # fmt: skip
        # A second server may not take a socket that is being listened on.
        taken = trident_cli("serve", "--port", "0", "--metrics-port", "0", "--unix-socket",
                            str(path), "--set", "train.backend=numpy")  # fmt: skip
        assert taken.returncode == 2 and "server.unix_socket" in taken.stderr, taken.stderr
    path.write_text("not a socket")
    refused = trident_cli("serve", "--port", "0", "--metrics-port", "0", "--unix-socket",
                          str(path), "--set", "train.backend=numpy")  # fmt: skip
    assert refused.returncode == 2 and "existing file" in refused.stderr, refused.stderr


def test_a_group_may_not_run_a_whole_rollout_ahead(rng: np.random.Generator) -> None:
    unroller = Unroller(T, [2, 3], D)
    fast, slow = ScriptedEnv(int(rng.integers(2**31)), 2), ScriptedEnv(int(rng.integers(2**31)), 3)
    unroller.observe(0, GroupStep(fast.obs))
    unroller.observe(1, GroupStep(slow.obs))

    def outcome(env: ScriptedEnv) -> GroupStep:
        moved = env.step(np.zeros(env.num_envs, np.int32))
        return GroupStep(moved.obs, moved.rewards, moved.terminated, moved.truncated,
                         moved.final_obs, np.flatnonzero(moved.truncated), moved.bce_labels,
                         moved.aux_targets)  # fmt: skip

    for _ in range(2 * T - 1):  # group 0 closes rollout 0 and fills all but the last of 1
        unroller.acted(0, np.zeros(2, np.int32), np.zeros(2, np.float32), 0)
        assert unroller.observe(0, outcome(fast)) == []
    assert unroller.env_steps_pending == 2 * (2 * T - 1)
    unroller.acted(0, np.zeros(2, np.int32), np.zeros(2, np.float32), 0)
    with pytest.raises(InvalidInput, match="at most one rollout ahead"):
        unroller.observe(0, outcome(fast))
    assert unroller.env_steps_pending == 2 * (2 * T - 1)  # the refused request changed nothing


def test_a_stream_reusing_an_applied_key_for_other_content_gets_that_refusal(
    tmp_path: Path, seed: int
) -> None:
    """A second stream under the same actor id and first sequence (another actor given the
    same id) completes a rollout of other content: its outcome is ALREADY_EXISTS naming the
    key, nothing is applied, and the stream goes on to its next rollout."""

    def one_rollout(client: TridentClient, env: ScriptedEnv, rollouts: int) -> list:
        stream = client.interact("twin", 0, T, [N])
        stream.send(0, env.obs, None)
        outcomes = []
        for _ in range(rollouts * T):
            reply = stream.receive()
            assert reply is not None
            outcomes.extend(reply.outcomes)
            moved = env.step(reply.actions)
            stream.send(0, moved.obs, moved)
        stream.close()
        while (reply := stream.receive()) is not None:
            outcomes.extend(reply.outcomes)
        return outcomes

    with running_server(tmp_path) as server, TridentClient(server.target) as client:
        first = one_rollout(client, ScriptedEnv(seed), 1)
        assert [o.reply is not None for o in first] == [True]
        digest = client.status().param_digest
        second = one_rollout(client, ScriptedEnv(seed + 1), 2)
        assert [o.sequence for o in second] == [0, 1]
        refused, applied = second
        assert refused.reply is None and refused.code == grpc.StatusCode.ALREADY_EXISTS
        assert refused.message.startswith("idempotency_key: twin#0 names a Step of other")
        assert applied.reply is not None and applied.reply.global_step == 2
        assert client.status().global_step == 2 and digest != client.status().param_digest


def test_the_server_counts_the_returns_of_episodes_that_end_on_its_streams(
    tmp_path: Path, seed: int
) -> None:
    """trident_episode_return: each environment's rewards summed per episode, observed when
    it ends (terminated or truncated), as the actor's own sums say."""
    env = ScriptedEnv(seed)
    sums, ended = np.zeros(N), []
    with running_server(tmp_path) as server, TridentClient(server.target) as client:
        stream = client.interact("returns", 0, T, [N])
        stream.send(0, env.obs, None)
        for _ in range(3 * T):
            reply = stream.receive()
            assert reply is not None
            moved = env.step(reply.actions)
            sums += moved.rewards
            done = moved.terminated | moved.truncated
            ended += sums[done].tolist()
            sums[done] = 0.0
            stream.send(0, moved.obs, moved)
        stream.receive()  # the last request's reply: its outcome was counted before it
        stream.close()
        while stream.receive() is not None:
            pass
        metrics = scrape(server)
    assert len(ended) > 0
    assert value(metrics, "trident_episode_return_count") == len(ended)
    assert value(metrics, "trident_episode_return_sum") == pytest.approx(sum(ended), rel=1e-5)
