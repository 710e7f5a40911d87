"""A Step over gRPC is the in-process Trainer's Step: same losses, same parameters, same Act."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import grpc
import numpy as np
import pytest
from conftest import random_rollout, running_server, small_config

from service.client.client import StepReply, TridentClient
from service.trainer.trainer import Trainer
from service.types import ActMode, StepResult

FLOAT32 = {"rtol": 2e-6, "atol": 1e-7}


def rollouts(rng: np.random.Generator, count: int) -> list:
    """`count` random rollouts: truncations with final observations throughout, BCE labels and
    aux targets on most, one without the perception labels, policy versions on some."""
    made = []
    for i in range(count):
        rollout = random_rollout(rng, extras=i != 2)
        while not rollout.truncated.any():
            rollout = random_rollout(rng, extras=i != 2)
        made.append(replace(rollout, policy_version=i - 1 if i % 2 and i else None))
    return made


def assert_reply_matches(reply: StepReply, local: StepResult, i: int) -> None:
    assert set(reply.losses) == set(local.losses), i
    for head, value in local.losses.items():
        np.testing.assert_allclose(reply.losses[head], value, **FLOAT32, err_msg=f"{i}: {head}")
    for name in ("grad_norm", "entropy", "approx_kl", "clip_fraction"):
        np.testing.assert_allclose(
            getattr(reply, name), getattr(local, name), **FLOAT32, err_msg=f"{i}: {name}"
        )
    assert reply.global_step == local.global_step == i + 1
    assert reply.policy_lag == local.policy_lag
    assert (reply.updates_applied, reply.updates_skipped) == (
        local.updates_applied,
        local.updates_skipped,
    )
    assert reply.skipped == local.skipped and reply.skip_reason == local.skip_reason
    assert {"queue", "prepare", "update", "total"} <= set(reply.timings_ms)


def without_timings(reply: StepReply) -> StepReply:
    """The reply less what differs between two servers by design: timings and the id each
    server gives its state."""
    return replace(reply, timings_ms={}, state_epoch=0)


def test_step_over_grpc_equals_in_process_trainer(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    batch = rollouts(rng, count=6)
    trainer = Trainer(small_config())
    obs = rng.standard_normal((33, 6)).astype(np.float32)
    with running_server(tmp_path) as server, TridentClient(server.target) as client:
        assert client.status().param_digest == trainer.param_digest()
        for i, rollout in enumerate(batch):
            reply = client.step(rollout)
            local = trainer.step(rollout)
            assert_reply_matches(reply, local, i)
            status = client.status()
            assert status.param_digest == trainer.param_digest(), f"digest after Step {i + 1}"
            assert status.global_step == trainer.global_step
            assert status.replay_size == len(trainer.state.replay)
        assert "q" in reply.losses, "the Q head never trained"
        remote = client.act(obs, ActMode.GREEDY_PI)
        here = trainer.act(obs, ActMode.GREEDY_PI)
        np.testing.assert_array_equal(remote.actions, here.actions)
        np.testing.assert_allclose(remote.log_probs, here.log_probs, **FLOAT32)
        np.testing.assert_allclose(remote.values, here.values, **FLOAT32)
        assert remote.policy_version == here.policy_version == len(batch)


def test_stream_step_equals_unary_steps(tmp_path: Path, rng: np.random.Generator) -> None:
    batch = rollouts(rng, count=5)
    with running_server(tmp_path / "unary") as unary, TridentClient(unary.target) as client:
        unary_replies = [client.step(rollout) for rollout in batch]
        unary_digest = client.status().param_digest
    with running_server(tmp_path / "stream") as stream, TridentClient(stream.target) as client:
        stream_replies = list(client.stream_step(batch))
        status = client.status()
    assert [r.global_step for r in stream_replies] == [1, 2, 3, 4, 5]
    assert [without_timings(r) for r in stream_replies] == [
        without_timings(r) for r in unary_replies
    ]
    assert status.param_digest == unary_digest and status.global_step == 5


def test_stream_step_stops_at_a_bad_rollout(tmp_path: Path, rng: np.random.Generator) -> None:
    good = rollouts(rng, count=3)
    bad = replace(good[1], actions=good[1].actions + 9)
    trainer = Trainer(small_config())
    for rollout in good[:2]:
        trainer.step(rollout)
    with running_server(tmp_path) as server, TridentClient(server.target) as client:
        replies = []
        with pytest.raises(grpc.RpcError) as caught:
            for reply in client.stream_step([good[0], good[1], bad, good[2]]):
                replies.append(reply)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "actions" in caught.value.details() and "expected" in caught.value.details()
        assert dict(caught.value.trailing_metadata() or ()).get("x-request-id")
        assert [r.global_step for r in replies] == [1, 2]
        status = client.status()
        assert status.global_step == 2 and status.param_digest == trainer.param_digest()
