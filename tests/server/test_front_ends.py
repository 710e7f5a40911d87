"""The server with gRPC front ends in processes of their own (server.front_ends = 2), through a
real `trident serve` and real channels: every call answers as in one process, bad input with the
same precise status; a front end SIGKILLed is replaced, its clients reconnect and no keyed Step
is applied twice; SIGTERM drains the front ends and the learner, with a final checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import grpc
import numpy as np
import pytest
from conftest import SERVING, SMALL, random_rollout, running_server, wait_until

from service.client.client import TridentClient
from service.config import load_config
from service.server.front_ends import AUTO_CORE_SHARE, AUTO_MIN_CORES, front_end_count
from service.step_ledger import StepKey
from service.testing.serverproc import ServerProcess, clean_env, scrape, serve_command, value
from tests.reliability.test_actor_restarts import (
    CARTPOLE,
    NUM_ENVS,
    actor_counts,
    applied_once,
    global_step,
)
from tests.reliability.test_actor_restarts import T as ROLLOUT_LEN
from tests.reliability.test_storm import D, N, T, limited, open_streams, start_stream

Code = grpc.StatusCode
SPLIT = "server.front_ends=2"
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]  # the kernel picks its front end anew


def front_end_pids(server: ServerProcess) -> list[int]:
    return list(server.events("serving")[0]["front_ends"])


def reached_step(server: ServerProcess) -> int:
    """The global step, or -1 where the call failed: a connection the kernel queued at a
    front end's listener as it was killed is reset, and the next one goes to a live one."""
    try:
        return global_step(server)
    except grpc.RpcError:
        return -1


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is reaped by its parent soon after; /proc says which
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except FileNotFoundError:  # reaped meanwhile
        return False


def test_every_call_answers_as_in_one_process(tmp_path: Path, rng: np.random.Generator) -> None:
    rollout = random_rollout(rng)
    with running_server(tmp_path, SPLIT) as server, TridentClient(server.target) as client:
        assert len(front_end_pids(server)) == 2
        first = client.step(rollout, key=StepKey("a", 0))
        again = client.step(rollout, key=StepKey("a", 0))
        assert (first.global_step, first.replayed, again.replayed) == (1, False, True)
        assert again.losses == first.losses
        acted = client.act(rng.standard_normal((5, 6)).astype(np.float32))
        assert acted.actions.shape == (5,) and acted.policy_version == 1
        saved = client.checkpoint("one")
        assert saved.name == "one" and saved.global_step == 1
        assert [c.name for c in client.list_checkpoints()] == ["one"]
        client.step(rollout)
        restored = client.restore("one")
        assert restored.checkpoint.global_step == 1
        status = client.status()
        assert status.global_step == 1 and status.param_digest == restored.param_digest
        settings = json.loads(client.update_hyperparams({"train.gamma": 0.9}))
        assert settings["train"]["gamma"] == 0.9
        # bad input: the status and the field named, as in one process
        for call, code, words in (
            (lambda: client.restore("nope"), Code.NOT_FOUND, "nope"),
            (lambda: client.act(np.zeros((2, 5), np.float32)), Code.INVALID_ARGUMENT, "obs"),
            (lambda: client.step(random_rollout(rng, D=5)), Code.INVALID_ARGUMENT, "obs"),
            (lambda: client.step(random_rollout(rng), key=StepKey("a", 0)), Code.ALREADY_EXISTS,
             "a#0"),
        ):
            with pytest.raises(grpc.RpcError) as error:
                call()
            assert error.value.code() == code and words in error.value.details()
        # a refusal is said by the front end that answered it, which its line names
        rejected = server.events("rejected")
        assert rejected and all(e["pid"] in front_end_pids(server) for e in rejected)
        assert {e["front_end"] for e in rejected} <= {0, 1}
        # health answers on every connection, whichever front end the kernel gave it
        for _ in range(6):
            with TridentClient(server.target, options=OWN_CONNECTION) as fresh:
                assert fresh.health() == "SERVING"
        samples = scrape(server)
        assert value(samples, "trident_steps_total") == 2
        assert value(samples, "trident_steps_replayed_total") == 1


def test_a_killed_front_end_is_replaced_and_nothing_is_applied_twice(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    """Keyed Steps from four clients while one front end is SIGKILLed: the clients' retries
    reconnect (to the other, or its replacement), and every key is applied once."""
    rollouts = [random_rollout(rng) for _ in range(6)]
    with running_server(tmp_path, SPLIT) as server:
        victim = front_end_pids(server)[0]
        errors: list[BaseException] = []

        def actor(a: int) -> None:
            try:
                with TridentClient(server.target, retries=40) as client:
                    for i, rollout in enumerate(rollouts):
                        client.step(rollout, key=StepKey(f"actor-{a}", i))
            except BaseException as error:  # reported below
                errors.append(error)

        threads = [threading.Thread(target=actor, args=(a,)) for a in range(4)]
        for thread in threads:
            thread.start()
        wait_until(lambda: value(scrape(server), "trident_steps_total") >= 3, 60, "3 Steps")
        os.kill(victim, signal.SIGKILL)
        for thread in threads:
            thread.join(120)
        assert not errors, errors
        died = wait_until(lambda: server.events("front end died"), 30, "the death logged")
        assert died[0]["pid"] == victim
        wait_until(lambda: len(server.events("front end serving")) == 3, 60, "a replacement")
        assert not alive(victim)
        samples = scrape(server)
        assert value(samples, "trident_front_end_restarts_total") == 1
        with TridentClient(server.target, retries=40) as client:
            assert client.status().global_step == value(samples, "trident_steps_total") == 24
            # every key sent again is answered, none applied again
            assert all(client.step(r, key=StepKey("actor-0", i)).replayed
                       for i, r in enumerate(rollouts))  # fmt: skip
            assert client.status().global_step == 24


def test_sigterm_drains_front_ends_and_learner_with_a_final_checkpoint(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    """SIGTERM with four slow Steps in flight through a front end: a new call is refused
    UNAVAILABLE, the four are answered OK, the final checkpoint holds them, every process
    exits (0, no front end counted as died)."""
    in_flight = 4
    server = running_server(tmp_path, SPLIT, "ppo.epochs=96", f"server.step_queue_size={in_flight}")
    rollouts = [random_rollout(rng, T=16, N=16) for _ in range(in_flight)]
    replies: list[int] = []
    failures: list[str] = []

    def send(rollout: object) -> None:
        with TridentClient(server.target) as client:
            try:
                replies.append(client.step(rollout, timeout_s=60).global_step)
            except grpc.RpcError as error:
                failures.append(f"{error.code().name} {error.details()}")

    with server:
        pids = front_end_pids(server)
        threads = [threading.Thread(target=send, args=(r,)) for r in rollouts]
        for thread in threads:
            thread.start()
        wait_until(lambda: value(scrape(server), "trident_step_queue_depth") >= in_flight - 1,
                   30, "the Steps queued", interval_s=0.005)  # fmt: skip
        server.proc.send_signal(signal.SIGTERM)
        with TridentClient(server.target, retries=0, options=OWN_CONNECTION) as late:
            def refused() -> bool:
                try:
                    late.act(np.zeros((2, 6), np.float32))
                except grpc.RpcError as error:
                    return error.code() == Code.UNAVAILABLE
                return False

            wait_until(refused, 10, "a new Act refused UNAVAILABLE")
        for thread in threads:
            thread.join(60)
        assert server.terminate() == 0, server.stderr()[-3000:]
    assert not failures, failures
    assert sorted(replies) == list(range(1, in_flight + 1))
    final = server.events("final checkpoint")
    assert final and final[0]["step"] == in_flight
    assert (server.checkpoint_dir / final[0]["name"]).is_dir()
    assert not any(alive(pid) for pid in pids)
    assert not server.events("front end died")


def test_admission_bounds_the_whole_server_not_each_process(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    """server.max_streams = 1 with a stream held: a stream on any other connection is refused,
    whichever front end the kernel gave that connection (six connections: with bounds per
    process about half would land on the other one and be let in); once the held stream ends,
    a place is free again."""
    with running_server(tmp_path, SPLIT, "server.max_streams=1") as server, \
            TridentClient(server.target) as client:  # fmt: skip
        held = start_stream(client, "held", rng)
        for i in range(6):
            with TridentClient(server.target, options=OWN_CONNECTION) as other:
                stream = other.interact(f"other-{i}", 0, T, [N])
                stream.send(0, rng.standard_normal((N, D)).astype(np.float32), None)
                with pytest.raises(grpc.RpcError) as caught:
                    stream.receive()
                assert caught.value.code() == Code.RESOURCE_EXHAUSTED
                assert "server.max_streams = 1" in caught.value.details()
        assert limited(server, "Interact", "server.max_streams") == 6  # on the one page
        held.cancel()
        wait_until(lambda: open_streams(server) == 0, 10, "the held stream ended")
        with TridentClient(server.target, options=OWN_CONNECTION) as other:
            start_stream(other, "after", rng).cancel()


def test_a_step_past_the_front_ends_rollout_slots_waits_for_one(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    """One front end with one rollout slot, held by a slow Step: Steps of two other clients
    on it wait for the slot (as the queue's room is waited for in one process) and are
    applied, none refused; a caller that gives up while it waits is abandoned, not applied."""
    slow, rollouts = random_rollout(rng, T=16, N=16), [random_rollout(rng) for _ in range(2)]
    settings = ("server.front_ends=1", "server.handoff_rollout_slots=1", "ppo.epochs=1000")
    with running_server(tmp_path, *settings) as server, TridentClient(server.target) as client:
        blocker = threading.Thread(target=client.step, args=(slow,))
        blocker.start()
        wait_until(lambda: value(scrape(server), "trident_rollouts_total") == 1, 30,
                   "the slow Step handed over")  # fmt: skip
        with pytest.raises(grpc.RpcError) as gave_up:  # waits for the slot past its deadline
            client.step(rollouts[0], key=StepKey("impatient", 0), timeout_s=0.2)
        assert gave_up.value.code() == Code.DEADLINE_EXCEEDED
        replies: list = []
        waiting = [threading.Thread(target=lambda i=i: replies.append(
            client.step(rollouts[i], key=StepKey(f"waits-{i}", 0)))) for i in range(2)]  # fmt: skip
        for thread in waiting:
            thread.start()
        for thread in [blocker, *waiting]:
            thread.join(120)
        assert len(replies) == 2 and not any(reply.replayed for reply in replies)
        assert client.status().global_step == 3  # the impatient caller's Step was not applied
    assert not server.events("refused")


def test_a_second_split_server_on_the_port_is_refused(tmp_path: Path) -> None:
    """Front ends bind with SO_REUSEPORT, which would let another server's front ends of this
    user share the port unnoticed: the learner finds the port answered and stops first."""
    with running_server(tmp_path / "first", SPLIT) as first:
        command = serve_command(tmp_path / "second" / "checkpoints", [*SMALL, *SERVING, SPLIT],
                                ("--port", str(first.port)))  # fmt: skip
        done = subprocess.run(command, env=clean_env(), capture_output=True, text=True,
                              timeout=60)  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert f"server.host:server.port = 127.0.0.1:{first.port}" in done.stderr
        assert "expected a free address to bind" in done.stderr
        assert '"serving"' not in done.stderr


@pytest.mark.slow
def test_actors_ride_through_front_end_kills_and_each_rollout_is_applied_once(
    tmp_path: Path,
) -> None:
    """Three `trident actor` processes (Interact streams) train a split server while both of
    its first front ends are SIGKILLed in turn, so every actor's connection breaks at least
    once: each reconnects (to the other front end or a replacement), sends again what it saw
    no outcome for, and ends with exit 0; the final checkpoint's ledger holds each actor's
    rollouts less its drops, and the replay holds each key's rollout once."""
    actors, steps, kill_at = 3, 32, (4, 12)
    server = running_server(tmp_path, SPLIT, *CARTPOLE)
    command = [sys.executable, "-m", "service.cli", "actor", "--server", server.target,
               "--env", "gymnasium:CartPole-v1", "--num-envs", str(NUM_ENVS), "--rollout-len",
               str(ROLLOUT_LEN), "--steps", str(steps), "--log-every", "1000",
               "--reconnect-timeout", "120"]  # fmt: skip
    pipes = {"env": clean_env(), "stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    procs = [subprocess.Popen([*command, "--seed", str(seed)], text=True, **pipes)
             for seed in range(actors)]  # fmt: skip
    try:
        # every stream open on one of the first two front ends, so each of them breaks
        wait_until(lambda: open_streams(server) == actors, 120, "every actor's stream open")
        for victim, threshold in zip(front_end_pids(server), kill_at, strict=True):
            wait_until(lambda: reached_step(server) >= threshold, 120,  # noqa: B023
                       f"global step {threshold}")  # fmt: skip
            os.kill(victim, signal.SIGKILL)
        outputs = [proc.communicate(timeout=300) for proc in procs]
        with TridentClient(server.target) as client:
            replay_size, reached = client.status().replay_size, client.status().global_step
    finally:
        for proc in procs:
            proc.kill()
        returncode = server.terminate()
    assert returncode == 0, server.stderr()[-3000:]
    assert len(server.events("front end died")) == 2
    counts = actor_counts(procs, outputs)
    assert all(figures["reconnects"] >= 1 for figures in counts.values()), counts
    _, _, applied = applied_once(server.checkpoint_dir, reached, counts)
    assert replay_size == sum(applied.values()) * ROLLOUT_LEN * NUM_ENVS  # each key's once


def test_a_killed_learner_takes_its_front_ends_with_it(tmp_path: Path) -> None:
    """SIGKILL of the learner process: its front ends see the handoff close and exit at once,
    leaving the port to the next server (no front end serves without a learner)."""
    with running_server(tmp_path, SPLIT) as server:
        pids = front_end_pids(server)
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait(30)
        wait_until(lambda: not any(alive(pid) for pid in pids), 30, "the front ends gone")
        with running_server(tmp_path / "next", extra_args=("--port", str(server.port))) as again:
            assert again.port == server.port


def test_the_default_front_ends_follow_the_cores_available() -> None:
    """server.front_ends = -1 (the default): front-end processes on a host with cores to run
    them (three in four cores, no more than server.handoff_max_mb holds the slots of), the
    server's own process on a small one; a number set is kept as it is."""
    assert load_config(env={}).server.front_ends == -1
    assert front_end_count(-1, fit=64, cores=2) == 0
    assert front_end_count(-1, fit=64, cores=AUTO_MIN_CORES - 1) == 0
    assert front_end_count(-1, fit=64, cores=AUTO_MIN_CORES) == 6
    assert front_end_count(-1, fit=64, cores=16) == 12
    assert front_end_count(-1, fit=10, cores=128) == 10  # the shared memory bounds it
    assert [front_end_count(n, fit=0, cores=2) for n in (0, 1, 3)] == [0, 1, 3]
    cores = len(os.sched_getaffinity(0))
    expected = min(int(cores * AUTO_CORE_SHARE), 64) if cores >= AUTO_MIN_CORES else 0
    assert front_end_count(-1, fit=64) == expected
