"""Exactly-once Steps: a keyed Step sent again (its request or reply lost, its deadline passed)
is applied once. With requests and replies dropped at random by a client interceptor, the
server ends where a run without drops ends: trident_steps_total, global_step, param_digest."""

from __future__ import annotations

import random
import signal
import threading
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from conftest import random_rollout, running_server

from service.client.client import TridentClient
from service.step_ledger import StepKey
from service.testing.serverproc import ServerProcess, scrape, value

STEPS = 12
Code = grpc.StatusCode


class DroppedCall(grpc.RpcError, grpc.Call):  # type: ignore[misc]
    """What a client sees when the network loses a request or a reply."""

    def code(self) -> grpc.StatusCode:
        return Code.UNAVAILABLE

    def details(self) -> str:
        return "dropped by the test's interceptor"

    def __getattr__(self, name: str) -> Any:  # the rest of grpc.Call, unused here
        raise AttributeError(name)


class DropSteps(grpc.UnaryUnaryClientInterceptor):
    """Loses Step requests (before the server sees them) and replies (after the server applied
    them): the first of each, then each with probability `p`; counts both."""

    def __init__(self, p: float, seed: int) -> None:
        self.p = p
        self.random = random.Random(seed)
        self.dropped = {"request": 0, "reply": 0}

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        if not details.method.endswith("/Step"):
            return continuation(details, request)
        if not self.dropped["request"] or self.random.random() < self.p:
            self.dropped["request"] += 1
            raise DroppedCall()
        outcome = continuation(details, request)
        outcome.result()  # the server has answered (applied, or refused)
        if not self.dropped["reply"] or self.random.random() < self.p:
            self.dropped["reply"] += 1
            raise DroppedCall()
        return outcome


def run(server: ServerProcess, rollouts: list, drops: DropSteps | None) -> list[int]:
    """Send each rollout once, keyed, in order; the global step each reply carried."""
    interceptors = [drops] if drops is not None else []
    with TridentClient(server.target, retries=40, interceptors=interceptors) as client:
        return [client.step(r, key=StepKey("actor-1", i)).global_step
                for i, r in enumerate(rollouts)]  # fmt: skip


def final_state(server: ServerProcess) -> tuple[float, int, str]:
    with TridentClient(server.target) as client:
        status = client.status()
    return value(scrape(server), "trident_steps_total"), status.global_step, status.param_digest


@pytest.mark.parametrize("front_ends", [0, 2])
def test_dropped_requests_and_replies_apply_each_rollout_once(
    tmp_path: Path, rng: np.random.Generator, seed: int, front_ends: int
) -> None:
    """The lossy run also through front-end processes (server.front_ends = 2): it ends where
    the clean run in one process ends."""
    rollouts = [random_rollout(rng) for _ in range(STEPS)]
    states, replies = [], []
    drops = DropSteps(p=0.3, seed=seed)
    for name, interceptor, split in (("clean", None, 0), ("lossy", drops, front_ends)):
        with running_server(tmp_path / name, f"train.seed={seed}",
                            f"server.front_ends={split}") as server:  # fmt: skip
            replies.append(run(server, rollouts, interceptor))
            states.append(final_state(server))
    print(f"\n[exactly-once] {STEPS} Steps, dropped {drops.dropped} (seed {seed})")
    assert drops.dropped["request"] and drops.dropped["reply"], drops.dropped
    assert replies[0] == replies[1] == list(range(1, STEPS + 1))
    assert states[0] == states[1] == (STEPS, STEPS, states[0][2])


def test_a_key_sent_again_is_answered_not_applied(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    rollout, other = random_rollout(rng), random_rollout(rng)
    with running_server(tmp_path) as server, TridentClient(server.target) as client:
        first = client.step(rollout, key=StepKey("a", 7))
        again = client.step(rollout, key=StepKey("a", 7))
        digest = client.status().param_digest
        # The key names the rollout: another one under the same key is refused, naming the key,
        # and neither applied nor answered with the first one's reply.
        with pytest.raises(grpc.RpcError) as reused:
            client.step(other, key=StepKey("a", 7))
        assert reused.value.code() == Code.ALREADY_EXISTS
        assert reused.value.details().startswith("idempotency_key: a#7 names a Step of other")
        assert client.status().param_digest == digest
        assert (first.replayed, again.replayed) == (False, True)
        assert first.global_step == again.global_step == 1
        assert first.losses == again.losses and first.grad_norm == again.grad_norm
        # Another actor's sequence 7, and this actor's 8, are new Steps.
        assert client.step(rollout, key=StepKey("b", 7)).global_step == 2
        assert client.step(rollout, key=StepKey("a", 8)).global_step == 3
        assert client.step(rollout).global_step == 4  # no key: applied every time
        assert client.step(rollout).global_step == 5
        samples = scrape(server)
        assert value(samples, "trident_steps_total") == 5
        assert value(samples, "trident_steps_replayed_total") == 1


@pytest.mark.parametrize("front_ends", [0, 2])
def test_copies_in_flight_together_apply_once(
    tmp_path: Path, rng: np.random.Generator, front_ends: int
) -> None:
    """Eight copies of one keyed Step sent at once beside a slow unkeyed Step: one is queued,
    the rest join it or find it applied; all get the same answer (also through a front-end
    process, where the copies are joined in the learner process)."""
    slow, rollout = random_rollout(rng, T=16, N=16), random_rollout(rng, T=16, N=16)
    with running_server(tmp_path, "ppo.epochs=48", f"server.front_ends={front_ends}") as server:
        replies: list[Any] = []
        with TridentClient(server.target) as client:
            blocker = threading.Thread(target=client.step, args=(slow,))
            blocker.start()
            copies = [threading.Thread(target=lambda: replies.append(
                client.step(rollout, key=StepKey("x", 0)))) for _ in range(8)]  # fmt: skip
            for thread in copies:
                thread.start()
            for thread in [blocker, *copies]:
                thread.join(60)
            assert client.status().global_step == 2
        assert len(replies) == 8 and len({(r.global_step, r.grad_norm) for r in replies}) == 1
        assert value(scrape(server), "trident_steps_replayed_total") == 7


def test_bad_and_forgotten_keys_are_refused_naming_what_is_wrong(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    rollout = random_rollout(rng)
    server = running_server(tmp_path, "server.step_key_window=2")
    with server, TridentClient(server.target) as client:
        for key, field in ((StepKey("", 1), "actor_id"), (StepKey("a b", 1), "actor_id"),
                           (StepKey("a", -1), "sequence")):  # fmt: skip
            with pytest.raises(grpc.RpcError) as error:
                client.step(rollout, key=key)
            assert error.value.code() == Code.INVALID_ARGUMENT
            assert f"idempotency_key.{field}" in error.value.details()
        for sequence in range(3):  # the window holds 2: sequence 0 is let go of
            client.step(rollout, key=StepKey("a", sequence))
        with pytest.raises(grpc.RpcError) as error:
            client.step(rollout, key=StepKey("a", 0))
        assert error.value.code() == Code.FAILED_PRECONDITION
        assert "server.step_key_window" in error.value.details()
        assert client.step(rollout, key=StepKey("a", 1)).replayed  # still remembered
        assert client.status().global_step == 3


def test_the_ledger_survives_a_restart_from_its_checkpoint(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    """SIGKILL after 5 keyed Steps with a checkpoint every 2: the restarted server (--resume)
    answers the 4 its checkpoint holds and applies the 5th, which the kill lost."""
    rollouts = [random_rollout(rng) for _ in range(5)]
    checkpoints = tmp_path / "checkpoints"
    with running_server(tmp_path / "first", "checkpoint.every_steps=2",
                        checkpoint_dir=checkpoints) as server:  # fmt: skip
        with TridentClient(server.target) as client:
            replies = [client.step(r, key=StepKey("a", i)) for i, r in enumerate(rollouts)]
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait(30)
    assert [r.checkpoint_step for r in replies] == [0, 2, 2, 4, 4]
    server = running_server(tmp_path / "second", "checkpoint.every_steps=2",
                            checkpoint_dir=checkpoints, extra_args=["--resume"])  # fmt: skip
    with server, TridentClient(server.target) as client:
        again = [client.step(r, key=StepKey("a", i)) for i, r in enumerate(rollouts)]
    assert [a.replayed for a in again] == [True, True, True, True, False]
    assert [a.global_step for a in again] == [r.global_step for r in replies] == [1, 2, 3, 4, 5]
    assert [a.losses for a in again[:4]] == [r.losses for r in replies[:4]]
