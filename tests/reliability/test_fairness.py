"""A fair learner, through real processes: `trident actor`s (Acrobot, the small model's
observation width) train one server while other clients misbehave or differ, and the server's
`step` log lines (each Step's rollout keys, `actor#sequence`) say whose rollouts each Step
trained.

- Idle, unread and cancelled streams (tests/storm.py) and a paused actor (SIGSTOP) hold no one
  back: the running actors keep training, Steps come to hold their rollouts alone (not the
  dozens a Step sized by the open streams waits for), and the paused one trains again once it
  goes on.
- A unary client sending keyed Steps as fast as it is answered, beside two actors and a stream
  ten times slower than they are, gets at least half a stream's share; the slow stream's
  rollouts are trained too.
- Restores of an older checkpoint under four actors: every actor trains again afterwards, and
  the refusals of the rollouts the Restores made stale are logged once per client and kind.

server.step_max_wait_ms is set to a minute, so a Step waiting on a client that sends nothing
would show as a Step of the wrong size or as no Step at all, not as a slower one.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest
from conftest import random_rollout, running_server, wait_until

from service.client.client import TridentClient
from service.step_ledger import StepKey
from service.testing.serverproc import ServerProcess, clean_env
from service.testing.storm import command as storm_command
from service.vector_env import EnvStep

ENV, OBS_DIM, ACTIONS = "gymnasium:Acrobot-v1", 6, 3
NUM_ENVS, T = 4, 8  # each actor's rollouts
# DEBUG: each Step's own log line, with its rollouts' keys
SHAPE = ("model.obs_dim=6", "model.num_actions=3", "model.aux_dim=0", "train.num_envs=8",
         "server.step_max_wait_ms=60000", "server.log_level=DEBUG")  # fmt: skip
WAIT_S = 60.0


@dataclass
class Actor:
    proc: subprocess.Popen[str]
    id: str


@contextlib.contextmanager
def actors(server: ServerProcess, count: int, *sizes: int) -> Iterator[list[Actor]]:
    """`count` `trident actor` processes of NUM_ENVS environments (or of `sizes`, in order),
    each known by the id its first line says."""
    command = [sys.executable, "-m", "service.cli", "actor", "--server", server.target,
               "--env", ENV, "--rollout-len", str(T), "--log-every", "1000000"]  # fmt: skip
    started: list[Actor] = []
    try:
        for seed in range(count):
            envs = sizes[seed] if seed < len(sizes) else NUM_ENVS
            proc = subprocess.Popen([*command, "--num-envs", str(envs), "--seed", str(seed)],
                                    env=clean_env(), stdout=subprocess.PIPE, text=True)  # fmt: skip
            header = proc.stdout.readline()  # type: ignore[union-attr]
            assert " | actor id " in header, header
            started.append(Actor(proc, header.rsplit(" | actor id ", 1)[1].split()[0]))
        yield started
    finally:
        for actor in started:
            actor.proc.kill()
            actor.proc.wait()


def steps_since(server: ServerProcess, since: float) -> list[dict]:
    """The Steps the server logged from `since` (time.time()) on."""
    return [event for event in server.events("step") if event["ts"] >= since]


def trained(server: ServerProcess, since: float = 0.0) -> Counter[str]:
    """Rollouts trained per client (its keys' actor id) in the Steps from `since` on."""
    return Counter(key.rsplit("#", 1)[0] for event in steps_since(server, since)
                   for key in event.get("keys") or ())  # fmt: skip


def latest_sizes(server: ServerProcess, since: float, count: int) -> list[int]:
    """How many rollouts each of the latest `count` Steps from `since` on trained."""
    return [event["rollouts"] for event in steps_since(server, since)[-count:]]


def every_actor_trains(server: ServerProcess, group: list[Actor], rollouts: int, since: float,
                       what: str) -> None:  # fmt: skip
    wait_until(lambda: all(trained(server, since)[a.id] >= rollouts for a in group), WAIT_S,
               lambda: f"{what}: {dict(trained(server, since))}")  # fmt: skip


def test_idle_unread_cancelled_and_paused_clients_hold_no_one_back(tmp_path: Path) -> None:
    with running_server(tmp_path, *SHAPE) as server, actors(server, 3, 32) as group:
        every_actor_trains(server, group, 3, 0.0, "every actor training")
        storm = subprocess.Popen(storm_command(server.target, 45),
                                 env=clean_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True)  # fmt: skip
        try:
            stormed = json.loads(storm.stdout.readline())  # type: ignore[union-attr]
            assert stormed["stormed"] == 45 and not stormed["client_errors"], stormed
            paused, running = group[0], group[1:]  # 32 environments, and 4 each
            os.kill(paused.proc.pid, signal.SIGSTOP)
            since = time.time()
            every_actor_trains(server, running, 10, since, "the running actors beside the storm")
            # The storm's 45 streams of 4 environments and the paused actor's 32 would make
            # Steps of 220 columns, 47 of the running actors' rollouts; the producing actors'
            # are 8 columns, 2 rollouts, once the paused one's grace is over.
            wait_until(lambda: max(latest_sizes(server, since, 5), default=99) <= 2, WAIT_S,
                       lambda: f"Steps of the running actors alone: "
                               f"{latest_sizes(server, since, 20)}")  # fmt: skip
            os.kill(paused.proc.pid, signal.SIGCONT)
            every_actor_trains(server, [paused], 3, time.time(), "the paused actor, going on")
        finally:
            storm.stdin.close()  # type: ignore[union-attr]
            storm.kill()
            storm.wait()


class SlowStream:
    """An Interact stream of one group of NUM_ENVS random environments that takes `step_s`
    for each env step: its outcomes, counted as they come."""

    def __init__(self, target: str, step_s: float) -> None:
        self.target, self.step_s = target, step_s
        self.answered = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        rng = np.random.default_rng(0)
        flags = np.zeros(NUM_ENVS, bool)
        try:
            with TridentClient(self.target) as client:
                stream = client.interact("slow-stream", 0, T, [NUM_ENVS])
                stream.send(0, rng.standard_normal((NUM_ENVS, OBS_DIM)), None)
                while not self.stop.is_set():
                    reply = stream.receive()
                    assert reply is not None
                    self.answered += sum(o.reply is not None for o in reply.outcomes)
                    time.sleep(self.step_s)
                    obs = rng.standard_normal((NUM_ENVS, OBS_DIM)).astype(np.float32)
                    moved = EnvStep(obs, rng.standard_normal(NUM_ENVS).astype(np.float32),
                                    flags, flags, np.zeros((0, OBS_DIM), np.float32), None,
                                    None)  # fmt: skip
                    stream.send(0, obs, moved)
                stream.cancel()
        except BaseException as error:  # said by the test
            self.error = error


def test_a_unary_client_and_a_slow_stream_get_their_share_beside_actors(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    # A policy lag that takes the slow stream's rollouts: it sees tens of Steps per rollout.
    lag = "train.max_policy_lag=1000"
    with running_server(tmp_path, *SHAPE, lag) as server, actors(server, 2) as group:
        every_actor_trains(server, group, 3, 0.0, "every actor training")
        slow = SlowStream(server.target, step_s=0.1)  # a rollout in 0.8 s: far slower
        unary_id, answered = "unary-client", 0
        started = time.time()
        with TridentClient(server.target) as client:
            version = client.status().global_step
            while answered < 30:  # as fast as it is answered
                rollout = random_rollout(rng, T=T, N=NUM_ENVS, A=ACTIONS, extras=False,
                                         policy_version=version)  # fmt: skip
                try:
                    reply = client.step(rollout, key=StepKey(unary_id, answered))
                except grpc.RpcError as error:
                    pytest.fail(f"a unary Step refused: {error.code().name} {error.details()}")
                version, answered = reply.global_step, answered + 1
        ended = time.time()
        wait_until(lambda: slow.answered >= 2 or slow.error, WAIT_S, "the slow stream trained")
        slow.stop.set()
        slow.thread.join(WAIT_S)
        assert slow.error is None, repr(slow.error)
        window = Counter(key.rsplit("#", 1)[0] for event in steps_since(server, started)
                         if event["ts"] <= ended for key in event.get("keys") or ())  # fmt: skip
    streams = [window[actor.id] for actor in group]
    print(f"\n[fairness] in the unary client's window: unary {window[unary_id]} rollouts, "
          f"actors {streams}, slow stream {window['slow-stream']}")
    assert window[unary_id] == answered
    assert window[unary_id] >= 0.5 * np.mean(streams), window


def test_every_actor_trains_again_after_restores_under_load(tmp_path: Path) -> None:
    with running_server(tmp_path, *SHAPE) as server, actors(server, 4) as group, \
            TridentClient(server.target) as client:  # fmt: skip
        every_actor_trains(server, group, 3, 0.0, "every actor training")
        older = client.checkpoint("older").global_step
        for restore in range(5):
            step = client.status().global_step
            wait_until(lambda s=step: client.status().global_step >= s + 3, WAIT_S,  # type: ignore[misc]
                       f"Steps before Restore {restore + 1}")  # fmt: skip
            client.restore("older")
        last = time.time()
        every_actor_trains(server, group, 2, last, "every actor after the last Restore")
        assert all(actor.proc.poll() is None for actor in group)
        restored = [event for event in server.events("restore") if event["name"] == "older"]
        assert len(restored) == 5 and restored[0]["step"] == older
        rejected = server.events("rejected")
    # The resends the Restores made stale are refused at once, and each client's refusals of a
    # kind are one line (a count line follows a minute on): not a line per refused try.
    refusals = Counter((e["client"], e["method"], e["kind"]) for e in rejected)
    print(f"\n[fairness] 5 Restores under 4 actors: {len(rejected)} refusal lines, "
          f"{dict(Counter(e['kind'] for e in rejected))}")
    assert all(count <= 2 for count in refusals.values()), refusals
