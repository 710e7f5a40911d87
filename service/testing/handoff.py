"""A stand-in learner and front ends for the handoff's tests and bench (service/handoff).

`EchoLearner` answers from exactly what arrived: an Act's outputs are functions of its
observations' bytes, mode and ε (`echo_act`, which a front end recomputes to check them), and a
rollout's Step result carries the rollout's digest, key and stream in its warnings. With
`hold`, Acts and rollouts wait until `release()`: work in the learner's hands. The `*_main`
functions are process entry points (multiprocessing's spawn imports them from here).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import asdict
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

from service.handoff import Delivery, Handoff, HandoffLimits, Hub, RolloutShape, SlotSizes
from service.testing.models import random_rollout
from service.types import ActMode, ActResult, StepResult


def echo_act(obs: np.ndarray, mode: ActMode, epsilon: float) -> ActResult:
    """Outputs that show every byte arrived: actions are the first column's bits, log-probs the
    last column, values the row sums plus ε; the version encodes the rows and the mode."""
    return ActResult(
        actions=obs[:, 0].view(np.int32).copy(),
        log_probs=obs[:, -1].copy(),
        values=obs.sum(axis=1, dtype=np.float32) + np.float32(epsilon),
        policy_version=obs.shape[0] + 1000 * list(ActMode).index(mode),
    )


def echo_step(delivery: Delivery) -> StepResult:
    return StepResult(
        warnings=[delivery.rollout.digest(), str(delivery.actor), str(delivery.sequence),
                  str(delivery.stream)],
        global_step=delivery.rollout.num_envs,
    )


class EchoLearner:
    """The learner's calls for a `Hub`; with `hold`, answered only at `release()`."""

    def __init__(self, hold: bool = False) -> None:
        self.hold = hold
        self.held: list[tuple[Future[Any], Callable[[], Any]]] = []
        self.deliveries: list[Delivery] = []  # held rollouts, to read `alive()`
        self.digests: dict[tuple[str | None, int], str] = {}
        self.lock = threading.Lock()
        self.hub: Hub | None = None

    def act(self, obs: np.ndarray, mode: ActMode, epsilon: float) -> Future[ActResult]:
        return self._answer(lambda: echo_act(obs, mode, epsilon))

    def step(self, delivery: Delivery) -> Future[StepResult]:
        def run() -> StepResult:
            result = echo_step(delivery)
            with self.lock:
                self.digests[delivery.actor, delivery.sequence] = result.warnings[0]
            return result

        if self.hold:
            with self.lock:
                self.deliveries.append(delivery)
        return self._answer(run)

    def _answer(self, run: Callable[[], Any]) -> Future[Any]:
        future: Future[Any] = Future()
        with self.lock:
            if self.hold:
                self.held.append((future, run))
                return future
        future.set_result(run())
        return future

    def release(self) -> int:
        """Answer every held call; how many."""
        with self.lock:
            held, self.held = self.held, []
            self.deliveries.clear()
        for future, run in held:
            future.set_result(run())
        return len(held)

    def call(self, front_end: int, name: str, args: Any) -> Any:
        assert self.hub is not None
        if name == "status":
            return {"front_ends": [asdict(info) for info in self.hub.front_ends()],
                    "held": len(self.held), "memfd_maps": memfd_maps(self.hub.name)}  # fmt: skip
        if name == "release":
            return self.release()
        raise ValueError(f"no call {name!r}")

    def serve(self, limits: HandoffLimits, path: str, name: str = "trident-handoff") -> Hub:
        self.hub = Hub(limits, self.act, self.step, self.call, name=name)
        self.hub.listen(path)
        return self.hub


def memfd_maps(name: str, pid: int | str = "self") -> int:
    """How many of a process's mappings are segments a hub called `name` made."""
    maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return sum(f"/memfd:{name}-" in line for line in maps)


def random_shape(rng: np.random.Generator, D: int) -> tuple[int, int, bool]:
    """(T, N, labelled) of a random rollout."""
    return int(rng.integers(1, 9)), int(rng.integers(1, 17)), bool(rng.integers(0, 2))


def exercise(handoff: Handoff, rng: np.random.Generator, acts: int, rollouts: int,
             actor: str) -> list[str]:  # fmt: skip
    """`acts` Acts of random rows, modes and ε, and `rollouts` random rollouts (of each, half
    written in place through a lent slot, half copied in), each checked against what the
    learner saw; the mismatches, said."""
    D, wrong = handoff.sizes.obs_dim, []
    for i in range(max(acts, rollouts)):
        if i < acts:
            rows = int(rng.integers(1, handoff.sizes.act_rows + 1))
            obs = rng.standard_normal((rows, D), dtype=np.float32)
            mode = list(ActMode)[int(rng.integers(0, len(ActMode)))]
            epsilon = float(np.float32(rng.random()))
            if i % 2:
                got = handoff.act(obs, mode, epsilon, timeout_s=60)
            else:  # written in place, as a request's decode would
                slot = handoff.act_slot(rows, timeout_s=60)
                slot.obs[:] = obs
                got = slot.run(mode, epsilon, timeout_s=60)
            want = echo_act(obs, mode, epsilon)
            for name in ("actions", "log_probs", "values", "policy_version"):
                if not np.array_equal(getattr(got, name), getattr(want, name)):
                    wrong.append(f"Act {i} ({rows} rows): {name} differs")
        if i < rollouts:
            T, N, labelled = random_shape(rng, D)
            rollout = random_rollout(rng, T=T, N=N, D=D, K=int(rng.integers(1, 5)),
                                     policy_version=int(rng.integers(0, 2**40)),
                                     extras=labelled)  # fmt: skip
            key = (actor, i)
            if i % 2:
                future = handoff.submit_rollout(rollout, key, stream=i, timeout_s=60)
            else:
                slot = handoff.rollout_slot(RolloutShape.of(rollout).with_final(0), timeout_s=60)
                for name, view in slot.arrays.items():
                    np.copyto(view, getattr(rollout, name), casting="unsafe")
                future = slot.submit(rollout.policy_version, rollout.final_obs,
                                     rollout.final_obs_index, key, stream=i)  # fmt: skip
            said = future.result(60).warnings
            if said != [rollout.digest(), actor, str(i), str(i)]:
                wrong.append(f"rollout {i} [{T}, {N}]: the learner saw {said[1:]} "
                             f"{said[0][:12]}, sent {rollout.digest()[:12]}")  # fmt: skip
    return wrong


# ----------------------------------------------------------------------- process entry points
def front_end_main(path: str, sizes: SlotSizes, seed: int, threads: int, acts: int,
                   rollouts: int, conn: Connection) -> None:  # fmt: skip
    """A front end whose `threads` threads each `exercise` the handoff; sends its mismatches."""
    handoff = Handoff.connect(path, sizes)
    wrong: list[str] = []

    def work(t: int) -> None:
        rng = np.random.default_rng([seed, t])
        wrong.extend(exercise(handoff, rng, acts, rollouts, f"fe{os.getpid()}-t{t}"))

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    conn.send({"wrong": wrong, "acts": threads * acts, "rollouts": threads * rollouts})
    handoff.close()


def stuck_front_end_main(path: str, sizes: SlotSizes, seed: int, conn: Connection) -> None:
    """A front end that fills every rollout slot and one Act slot, says so, and waits to be
    killed (the learner holds them)."""
    handoff = Handoff.connect(path, sizes)
    rng = np.random.default_rng(seed)
    for i in range(sizes.rollout_slots):
        handoff.submit_rollout(random_rollout(rng, D=sizes.obs_dim), ("stuck", i))
    obs = rng.standard_normal((sizes.act_rows, sizes.obs_dim), dtype=np.float32)
    threading.Thread(target=handoff.act, args=(obs, ActMode.SAMPLE), daemon=True).start()
    conn.send({"pid": os.getpid(), "rollouts": sizes.rollout_slots, "acts": 1})
    while True:
        time.sleep(60)


def learner_main(path: str, limits: HandoffLimits, hold: bool, conn: Connection) -> None:
    """A learner process: an EchoLearner's hub at `path`; says "ready", then serves until
    killed."""
    learner = EchoLearner(hold=hold)
    learner.serve(limits, path)
    conn.send("ready")
    while True:
        time.sleep(60)
