"""What a rollout and an Act cost between a front-end process and the learner process: through the
shared-memory handoff (service/handoff) against pickling over a pipe (multiprocessing.Queue).

This process is the learner: a `Hub` whose Step and Act answer at once (echo outputs, no
training), or a thread answering a Queue the same way. A spawned front-end process times:
- a rollout's round trip, one in flight (the front end's submit to the learner's answer: the
  copy into a slot and the header, or the pickling, the pipe and the unpickling), median;
- throughput with `--depth` rollouts in flight (the handoff's rollout slots);
- the same through the handoff "in place": the rollout's arrays already in the slot, as a
  stream that assembles its rollout there has them (the final observations copied, the header
  sent);
- an Act of `--act-rows` observations' round trip, one in flight, p50 and p99.
Shapes: LobSim's (T = 32, 1,024 columns, 56 features, BCE labels, 3 aux targets) and CartPole's
(T = 32, 512 columns, 4 features, no labels). Each repeat starts fresh processes; the table gives
the median of the repeats and their range. Prints a table and writes JSON.

    flock /tmp/cpu.lock python3 bench/handoff.py                 # 3 repeats
    python3 bench/handoff.py --repeats 1 --rollouts 20 --acts 200 --out /tmp/handoff.json
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

from service.handoff import Delivery, Handoff, HandoffLimits, Hub, RolloutShape
from service.testing import host_report
from service.testing.handoff import echo_act
from service.testing.models import random_rollout
from service.types import ActMode, ActResult, Rollout, StepResult

SPAWN = multiprocessing.get_context("spawn")
SHAPES = {  # name -> (T, N, D, K: aux targets, labels)
    "lobsim 32x1024x56": (32, 1024, 56, 3, True),
    "cartpole 32x512x4": (32, 512, 4, 0, False),
}
MIB = 2**20
SWITCH_S = 0.0005  # the server's GIL switch interval (server.gil_switch_interval_ms), both sides


def rollout_of(shape: tuple[int, int, int, int, bool], seed: int) -> Rollout:
    T, N, D, K, labels = shape
    return random_rollout(np.random.default_rng(seed), T=T, N=N, D=D, K=max(K, 1),
                          policy_version=7, extras=labels)  # fmt: skip


def done(value: Any) -> Future[Any]:
    future: Future[Any] = Future()
    future.set_result(value)
    return future


# ------------------------------------------------------------------------------ the two routes
class Route:
    """The front end's side of one route: submit a rollout (a Future of its answer), Act."""

    submit: Callable[[Rollout], Future[Any]]
    act: Callable[[np.ndarray], ActResult]

    def close(self) -> None: ...


class HandoffRoute(Route):
    """`in_place`: the rollout's fixed arrays count as written where they lie (a stream's
    Unroller writes them into its slot as the steps come), so a submit takes a slot, copies the
    final observations and sends the header; else the whole rollout is copied into a slot."""

    def __init__(self, path: str, limits: HandoffLimits, D: int, in_place: bool) -> None:
        self.handoff = Handoff.connect(path, limits.sizes(D))
        self.submit = self._in_place if in_place else self._copied
        self.act = lambda obs: self.handoff.act(obs, ActMode.SAMPLE)

    def _copied(self, rollout: Rollout) -> Future[Any]:
        return self.handoff.submit_rollout(rollout, ("bench", 0))

    def _in_place(self, rollout: Rollout) -> Future[Any]:
        slot = self.handoff.rollout_slot(RolloutShape.of(rollout).with_final(0))
        return slot.submit(rollout.policy_version, rollout.final_obs, rollout.final_obs_index,
                           ("bench", 0))  # fmt: skip

    def close(self) -> None:
        self.handoff.close()


class QueueRoute(Route):
    """Pickled requests on one Queue, answers on another, matched by id by a reader thread."""

    def __init__(self, requests: Any, answers: Any) -> None:
        self.requests, self.answers = requests, answers
        self.waiting: dict[int, Future[Any]] = {}
        self.ids = iter(range(1 << 62))
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _send(self, kind: str, payload: Any) -> Future[Any]:
        future: Future[Any] = Future()
        request = next(self.ids)
        self.waiting[request] = future
        self.requests.put((request, kind, payload))
        return future

    def _read(self) -> None:
        while (answer := self.answers.get()) is not None:
            request, value = answer
            self.waiting.pop(request).set_result(value)

    def submit(self, rollout: Rollout) -> Future[Any]:  # type: ignore[override]
        return self._send("rollout", rollout)

    def act(self, obs: np.ndarray) -> ActResult:  # type: ignore[override]
        return self._send("act", obs).result()

    def close(self) -> None:
        self.requests.put(None)
        self.reader.join()


def queue_learner(requests: Any, answers: Any) -> None:
    """The learner's end of the Queue route: unpickle, answer as the hub's echo learner does."""
    while (request := requests.get()) is not None:
        request_id, kind, payload = request
        if kind == "act":
            answers.put((request_id, echo_act(payload, ActMode.SAMPLE, 0.0)))
        else:
            answers.put((request_id, StepResult(global_step=payload.num_envs)))
    answers.put(None)


# ------------------------------------------------------------------------------ the front end
def front_end_main(route: str, path: str, limits: HandoffLimits, queues: Any,
                   args: dict[str, Any], conn: Connection) -> None:  # fmt: skip
    """Time each shape's rollouts and the Act, on one route; send the timings back."""
    sys.setswitchinterval(SWITCH_S)
    results: dict[str, Any] = {}
    pipe = QueueRoute(*queues) if route == "queue" else None
    for name, shape in SHAPES.items():
        rollouts = [rollout_of(shape, seed) for seed in range(4)]
        link = pipe or HandoffRoute(path, limits, shape[2], in_place=route == "in place")
        for i in range(2 * args["depth"]):  # warm: every slot's pages, the pipe
            link.submit(rollouts[i % 4]).result()
        trips = []
        for i in range(args["rollouts"]):
            started = time.perf_counter()
            link.submit(rollouts[i % 4]).result()
            trips.append(time.perf_counter() - started)
        started, window = time.perf_counter(), []
        for i in range(args["rollouts"] * 2):
            if len(window) == args["depth"]:
                window.pop(0).result()
            window.append(link.submit(rollouts[i % 4]))
        for future in window:
            future.result()
        elapsed = time.perf_counter() - started
        nbytes = sum(array.nbytes for array in vars(rollouts[0]).values()
                     if isinstance(array, np.ndarray))  # fmt: skip
        results[name] = {"rollout_ms_p50": 1e3 * statistics.median(trips),
                         "rollouts_per_s": args["rollouts"] * 2 / elapsed,
                         "mib_per_s": args["rollouts"] * 2 * nbytes / elapsed / MIB,
                         "rollout_mib": nbytes / MIB}  # fmt: skip
        if name.startswith("lobsim"):
            obs = np.random.default_rng(0).standard_normal((args["act_rows"], shape[2]),
                                                           dtype=np.float32)  # fmt: skip
            for _ in range(20):
                link.act(obs)
            acts = []
            for _ in range(args["acts"]):
                started = time.perf_counter()
                link.act(obs)
                acts.append(time.perf_counter() - started)
            p50, p99 = np.percentile(np.array(acts) * 1e3, [50, 99])
            results["act"] = {"rows": args["act_rows"], "act_ms_p50": float(p50),
                              "act_ms_p99": float(p99)}  # fmt: skip
        if pipe is None:
            link.close()
    if pipe is not None:
        pipe.close()
    conn.send(results)


def measure(route: str, args: argparse.Namespace) -> dict[str, Any]:
    """One repeat of one route: this process the learner, a spawned process the front end."""
    sys.setswitchinterval(SWITCH_S)
    limits = HandoffLimits(act_slots=4, act_rows=args.act_rows, rollout_slots=args.depth,
                           rollout_bytes=64 * MIB, max_bytes=4096 * MIB)  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        path, hub, queues, learner = str(Path(folder) / "learner.sock"), None, None, None
        if route != "queue":

            def step(delivery: Delivery) -> Future[StepResult]:
                return done(StepResult(global_step=delivery.rollout.num_envs))

            hub = Hub(limits, lambda obs, mode, eps: done(echo_act(obs, mode, eps)), step)
            hub.listen(path)
        else:
            queues = (SPAWN.Queue(), SPAWN.Queue())
            learner = threading.Thread(target=queue_learner, args=queues, daemon=True)
            learner.start()
        mine, theirs = SPAWN.Pipe()
        process = SPAWN.Process(target=front_end_main,
                                args=(route, path, limits, queues, vars(args), theirs))  # fmt: skip
        process.start()
        result = mine.recv()
        process.join()
        if hub is not None:
            hub.close()
        if learner is not None:
            assert queues is not None
            learner.join()
    return result


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per shape and figure: the median of the repeats and their range."""
    out: dict[str, Any] = {}
    for name in runs[0]:
        out[name] = {}
        for figure in runs[0][name]:
            values = [run[name][figure] for run in runs]
            out[name][figure] = {"median": statistics.median(values), "min": min(values),
                                 "max": max(values)}  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rollouts", type=int, default=100, help="timed round trips a shape")
    parser.add_argument("--depth", type=int, default=8, help="rollouts in flight (throughput)")
    parser.add_argument("--acts", type=int, default=2000)
    parser.add_argument("--act-rows", type=int, default=1024)
    parser.add_argument("--out", type=Path, default=Path("bench/results/handoff.json"))
    args = parser.parse_args(argv)
    runs: dict[str, list[dict[str, Any]]] = {"handoff": [], "in place": [], "queue": []}
    for _ in range(args.repeats):
        for route in runs:
            runs[route].append(measure(route, args))
    result = {route: summary(repeats) for route, repeats in runs.items()}
    print(f"{'shape':<20} {'route':<8} {'MiB':>6} {'ms / rollout':>20} {'rollouts/s':>22} "
          f"{'MiB/s':>22}")  # fmt: skip

    def cell(stat: dict[str, float], digits: int) -> str:
        return (f"{stat['median']:.{digits}f} ({stat['min']:.{digits}f}-"
                f"{stat['max']:.{digits}f})")  # fmt: skip

    for name in SHAPES:
        for route in runs:
            row = result[route][name]
            print(f"{name:<20} {route:<8} {row['rollout_mib']['median']:>6.2f} "
                  f"{cell(row['rollout_ms_p50'], 3):>20} {cell(row['rollouts_per_s'], 0):>22} "
                  f"{cell(row['mib_per_s'], 0):>22}")  # fmt: skip
    for route in ("handoff", "queue"):  # "in place" acts as "handoff" does
        act = result[route]["act"]
        print(f"Act {args.act_rows} rows, {route}: p50 {cell(act['act_ms_p50'], 3)} ms, "
              f"p99 {cell(act['act_ms_p99'], 3)} ms")  # fmt: skip
    host_report.write_record(args.out, "bench/handoff.py", ["numpy", "trident"],
                             {"settings": vars(args) | {"out": str(args.out)},
                              "repeats": runs, "summary": result})  # fmt: skip
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
