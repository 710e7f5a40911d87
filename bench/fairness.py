"""Fairness: what other clients do to an actor's training, at the server's defaults.

    python3 bench/fairness.py                  # CartPole actors, every CPU mix
    python3 bench/fairness.py --load lobsim --actors 12 --mixes gpu --set train.backend=cuda

Each mix runs on a server of its own (the load's model shape, its defaults otherwise; --set
makes a tuned row) trained by K `trident actor` processes at their defaults (the server's
train.num_envs and rollout_len; or --num-envs, --rollout-len). After --warmup s, a baseline
window of --window s with the actors alone; then the mix's other clients join (or act) and,
--settle s later, a second window of --window s:

- idle: a storm (service/testing/storm.py) of --idle-streams Interact streams of --idle-envs
  environments each: a third send half a rollout and fall silent, never reading; a third send
  half a rollout and drop their connection; a third send nothing;
- paused: actor 0 is stopped (SIGSTOP) through the window, then goes on (SIGCONT);
- slow: a stream with no env (bench/served.py's loadgen worker) whose env steps take
  --slow-factor times as long as the actors' own;
- unary: a unary client (the loadgen worker's `step` protocol: keyed Steps of the actors'
  rollout shape, random actions, no Acts) that sends as fast as it is answered;
- restores: a Checkpoint, then --restores Restores of it, --restore-every s apart, under K
  actors;
- gpu: the idle storm and the unary client together (the GPU host's mix).

Per client, from the server's `step` log lines (each Step's rollout keys): the rollouts and env
steps trained per second in each window and their ratio, and the longest wait between its
answers (the Steps that trained its rollouts, the window's edges included); the Steps' own time.
Restores: each actor's time from the last Restore to the next Step that trained its rollouts,
and the refusal lines the server logged. Over the whole mix: the rollouts the server was
handed and dropped, by reason. Writes JSON (command, date, machine, versions, every mix) to
--out and prints one table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import served
from served import LOADS, LoadProcess, child_env, spawn, stop

from service.client.client import TridentClient
from service.testing import host_report
from service.testing.serverproc import ServerProcess, scrape
from service.testing.storm import command as storm_command

HEADER = re.compile(r"runs (?P<N>\d+) .*, rollouts of (?P<T>\d+) steps .* \| actor id (?P<id>\S+)")
MIXES = ("idle", "paused", "slow", "unary", "restores", "gpu")
CPU_MIXES = MIXES[:5]
WORKER_SHAPE = {"lobsim": "lobsim", "cartpole": "cartpole", "loadgen": "lobsim"}
RECOVERY_WAIT_S = 60.0  # for a paused or restored actor's next trained Step
LONG_S = 10**6  # the workers' --duration: until stopped


@dataclass
class Client:
    """A client whose trained rollouts the windows count: its keys' actor id and the env steps
    of one of its rollouts."""

    name: str
    id: str
    env_steps: int
    process: LoadProcess


@dataclass
class Mix:
    """A running mix: its server, actors, the clients it added and what it started."""

    name: str
    server: ServerProcess
    actors: list[Client]
    workdir: Path
    args: argparse.Namespace
    others: list[Client]
    storm: subprocess.Popen[str] | None = None


# ------------------------------------------------------------------------------- windows
Answers = list[tuple[float, int]]


def answers(server: ServerProcess, client: Client, start: float, end: float) -> Answers:
    """(time, rollouts of `client`) of each Step in [start, end) that trained its rollouts."""
    found = []
    for event in server.events("step"):
        if start <= event["ts"] < end:
            count = sum(key.rsplit("#", 1)[0] == client.id for key in event.get("keys") or ())
            if count:
                found.append((event["ts"], count))
    return found


def window(server: ServerProcess, client: Client, start: float, end: float) -> dict[str, Any]:
    """What `client` got in [start, end): rollouts, env steps trained per second, the longest
    wait between answers (the window's edges count as answers)."""
    got = answers(server, client, start, end)
    rollouts = sum(count for _, count in got)
    edges = [start, *(at for at, _ in got), end]
    return {
        "rollouts": rollouts,
        "env_steps_per_s": round(rollouts * client.env_steps / (end - start), 1),
        "longest_wait_s": round(float(np.max(np.diff(edges))), 3),
    }


def step_times(server: ServerProcess, start: float, end: float) -> dict[str, Any]:
    """The Steps' own time (ms) and size (rollouts) in [start, end)."""
    steps = [e for e in server.events("step") if start <= e["ts"] < end]
    ms = [e["ms"] for e in steps]
    sizes = [e["rollouts"] for e in steps]
    return {
        "steps": len(steps),
        "step_ms_p50": round(float(np.median(ms)), 2) if ms else None,
        "step_ms_max": round(max(ms), 2) if ms else None,
        "rollouts_per_step_p50": float(np.median(sizes)) if sizes else None,
    }


def first_answer_after(server: ServerProcess, client: Client, moment: float) -> float | None:
    """Seconds from `moment` to the first Step after it that trained `client`'s rollouts,
    waiting up to RECOVERY_WAIT_S."""
    deadline = time.monotonic() + RECOVERY_WAIT_S
    while time.monotonic() < deadline:
        got = answers(server, client, moment, float("inf"))
        if got:
            return round(got[0][0] - moment, 3)
        time.sleep(0.2)
    return None


# ------------------------------------------------------------------------------- processes
def wait_ready(processes: list[LoadProcess], timeout_s: float = served.PROCESS_START_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(p.ready_at is not None for p in processes):
        for process in processes:
            process.watch()
            if process.exited_at is not None:
                raise RuntimeError(f"process {process.index} exited: {served.tail(process.err)}")
        if time.monotonic() > deadline:
            raise RuntimeError("a process did not start in time")
        time.sleep(served.POLL_S)


def start_actors(server: ServerProcess, args: argparse.Namespace, workdir: Path) -> list[Client]:
    load = LOADS[args.load]
    sizes = [] if args.num_envs is None else ["--num-envs", str(args.num_envs)]
    sizes += [] if args.rollout_len is None else ["--rollout-len", str(args.rollout_len)]
    command = [sys.executable, "-m", "service.cli", "actor", "--server", server.target,
               "--env", str(load.env), "--log-every", str(2**62), *sizes]  # fmt: skip
    processes = [spawn([*command, "--seed", str(index)], index, None, workdir)
                 for index in range(args.actors)]  # fmt: skip
    wait_ready(processes)
    clients = []
    for process in processes:
        header = HEADER.search(process.start_line or "")
        assert header is not None, process.start_line
        env_steps = int(header["T"]) * int(header["N"])
        clients.append(Client(f"actor {process.index}", header["id"], env_steps, process))
    return clients


def start_worker(mix: Mix, name: str, protocol: str, env_ms: float) -> Client:
    """A loadgen worker of the actors' rollout shape: `protocol` interact (a stream) or step
    (a unary client)."""
    actor = mix.actors[0]
    header = HEADER.search(actor.process.start_line or "")
    assert header is not None
    index = 100 + len(mix.others)
    command = [sys.executable, str(served.SCRIPT), "--worker", "loadgen", "--protocol", protocol,
               "--shape", WORKER_SHAPE[mix.args.load], "--env-ms", f"{env_ms:g}", "--server",
               mix.server.target, "--num-envs", header["N"], "--rollout-len", header["T"],
               "--duration", str(LONG_S), "--seed", str(index), "--actor-id", name,
               "--record", str(mix.workdir / f"{name}.json")]  # fmt: skip
    process = spawn(command, index, mix.workdir / f"{name}.json", mix.workdir)
    wait_ready([process])
    client = Client(name, name, actor.env_steps, process)
    mix.others.append(client)
    return client


def start_storm(mix: Mix) -> None:
    with TridentClient(mix.server.target) as client:
        obs_dim = json.loads(client.status().config_json)["model"]["obs_dim"]
    mix.storm = subprocess.Popen(
        storm_command(mix.server.target, mix.args.idle_streams, obs_dim, mix.args.idle_envs),
        env=child_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    said = json.loads(mix.storm.stdout.readline())  # type: ignore[union-attr]
    if said.get("client_errors"):
        raise RuntimeError(f"the storm's clients failed: {said['client_errors']}")


# ------------------------------------------------------------------------------- the mixes
def disturb(mix: Mix, baseline: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Start what the mix adds to the actors; what it measured by itself."""
    name, args = mix.name, mix.args
    if name in ("idle", "gpu"):
        start_storm(mix)
    if name in ("unary", "gpu"):
        start_worker(mix, "unary", "step", 0.0)
    if name == "paused":
        os.kill(mix.actors[0].process.popen.pid, signal.SIGSTOP)
    if name == "slow":
        # the actors' interval between rollouts over T env steps, times the factor
        rates = [baseline[a.name]["rollouts"] / args.window for a in mix.actors]
        interval_s = 1 / max(float(np.median(rates)), 1e-3)
        T = int(HEADER.search(mix.actors[0].process.start_line or "")["T"])  # type: ignore[index]
        env_ms = 1e3 * args.slow_factor * interval_s / T
        start_worker(mix, "slow", "interact", env_ms)
        return {"slow_env_ms": round(env_ms, 2)}
    if name == "restores":
        return restores(mix)
    return {}


def restores(mix: Mix) -> dict[str, Any]:
    """A Checkpoint, then the Restores of it, while the actors train."""
    with TridentClient(mix.server.target) as client:
        older = client.checkpoint("older").global_step
        for _ in range(mix.args.restores):
            time.sleep(mix.args.restore_every)
            client.restore("older")
    last = max(e["ts"] for e in mix.server.events("restore"))
    recovery = {a.name: first_answer_after(mix.server, a, last) for a in mix.actors}
    return {"restored_to_step": older, "restores": mix.args.restores, "recovery_s": recovery}


def settle(mix: Mix) -> dict[str, Any]:
    """End what the mix started that must end before the figures: the pause."""
    if mix.name != "paused":
        return {}
    resumed = time.time()
    os.kill(mix.actors[0].process.popen.pid, signal.SIGCONT)
    return {"recovery_s": {mix.actors[0].name: first_answer_after(mix.server, mix.actors[0],
                                                                  resumed)}}  # fmt: skip


def run_mix(name: str, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    workdir = root / name
    workdir.mkdir(parents=True)
    settings = [*LOADS[args.load].shape, "server.shutdown_grace_s=5", *args.set]
    server = ServerProcess.start(workdir, settings, startup_timeout_s=served.SERVER_START_S,
                                 dies_with_parent=True,
                                 env={"PYTHONPATH": child_env()["PYTHONPATH"],
                                      # each Step's own log line, with its rollouts' keys
                                      "TRIDENT_SERVER__LOG_LEVEL": "DEBUG"})  # fmt: skip
    mix = Mix(name, server, [], workdir, args, [])
    result: dict[str, Any] = {"mix": name, "server_set": settings}
    try:
        mix.actors = start_actors(server, args, workdir)
        while not server.events("step"):
            time.sleep(served.POLL_S)
        start = time.time() + args.warmup
        time.sleep(start + args.window - time.time())
        baseline = {a.name: window(server, a, start, start + args.window) for a in mix.actors}
        result["baseline"] = {**baseline, **step_times(server, start, start + args.window)}
        disturbed = time.time()
        result.update(disturb(mix, baseline))
        start = max(time.time(), disturbed + args.settle)
        time.sleep(max(0.0, start + args.window - time.time()))
        clients = mix.actors + mix.others
        result["with"] = {**{c.name: window(server, c, start, start + args.window)
                             for c in clients}, **step_times(server, start, start + args.window)}
        result.update(settle(mix))
        result["refusal_lines"] = len([e for e in server.events("rejected")
                                       if e["ts"] >= disturbed])  # fmt: skip
        samples = scrape(server)
        result["rollouts"] = int(served.delta({}, samples, "trident_rollouts_total"))
        result["dropped"] = {dict(labels)["reason"]: int(value)
                             for (metric, labels), value in samples.items()
                             if metric == "trident_rollouts_dropped_total" and value}  # fmt: skip
        result["env_steps_per_rollout"] = {c.name: c.env_steps for c in clients}
        result["targets"] = targets(mix, result)
    finally:
        if mix.storm is not None:
            mix.storm.kill()
        for client in mix.actors + mix.others:
            stop(client.process.popen)
        result["server_exit"] = server.terminate(served.STOP_TIMEOUT_S)
    return result


def targets(mix: Mix, result: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets, as measured: the other actors' rate ratio (>= 0.9 beside idle,
    paused or slow clients: a unary client's share of a busy learner is its own) and their
    longest wait past the baseline's (<= one Step's time + 1 s); a unary client's rollouts
    against the mean actor's (>= 0.5); every actor's recovery after Restores (<= 5 s)."""
    base, with_ = result["baseline"], result["with"]
    others = mix.actors[1:] if mix.name == "paused" else mix.actors
    found: dict[str, Any] = {}
    if mix.name != "restores":
        ratios = [with_[a.name]["env_steps_per_s"] / base[a.name]["env_steps_per_s"]
                  for a in others if base[a.name]["env_steps_per_s"]]  # fmt: skip
        step_s = (with_["step_ms_max"] or 0) / 1e3
        extra = [with_[a.name]["longest_wait_s"] - base[a.name]["longest_wait_s"] for a in others]
        found["others_min_ratio"] = round(min(ratios), 3) if ratios else None
        found["others_max_extra_wait_s"] = round(max(extra), 3)
        found["wait_held"] = max(extra) <= step_s + 1.0
        if mix.name != "unary":  # a unary client takes its share of a busy learner by design
            found["rate_held"] = bool(ratios) and min(ratios) >= 0.9
    if "unary" in with_:
        mean = float(np.mean([with_[a.name]["rollouts"] for a in mix.actors]))
        found["unary_share"] = round(with_["unary"]["rollouts"] / mean, 3) if mean else None
        found["unary_held"] = bool(mean) and with_["unary"]["rollouts"] >= 0.5 * mean
    if "recovery_s" in result:
        waits = list(result["recovery_s"].values())
        found["recovered_held"] = all(w is not None and w <= 5.0 for w in waits)
    return found


# ------------------------------------------------------------------------------- report
def print_table(mixes: list[dict[str, Any]]) -> None:
    print(f"{'mix':<9} {'client':<9} {'env st/s base':>13} {'with':>9} {'ratio':>6} "
          f"{'wait base':>9} {'with':>6} {'rollouts':>8}")  # fmt: skip
    for mix in mixes:
        base, with_ = mix.get("baseline", {}), mix.get("with", {})
        for name, got in with_.items():
            if not isinstance(got, dict):
                continue
            before = base.get(name, {})
            rate = before.get("env_steps_per_s")
            ratio = f"{got['env_steps_per_s'] / rate:.2f}" if rate else "-"
            print(f"{mix['mix']:<9} {name:<9} {rate or '-':>13} {got['env_steps_per_s']:>9} "
                  f"{ratio:>6} {before.get('longest_wait_s', '-'):>9} "
                  f"{got['longest_wait_s']:>6} {got['rollouts']:>8}")  # fmt: skip
        print(f"{'':<9} targets {mix.get('targets')} dropped {mix.get('dropped')} refusal lines "
              f"{mix.get('refusal_lines')}" + (f" recovery {mix['recovery_s']}"
                                               if "recovery_s" in mix else ""))  # fmt: skip


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--load", choices=["cartpole", "lobsim"], default="cartpole")
    parser.add_argument("--actors", type=int, default=2, help="K actors of the load")
    parser.add_argument("--num-envs", type=int, help="each actor's (default: the server's)")
    parser.add_argument("--rollout-len", type=int, help="each actor's (default: the server's)")
    parser.add_argument("--mixes", nargs="+", choices=MIXES, default=list(CPU_MIXES))
    parser.add_argument("--warmup", type=float, default=10.0, help="s before the baseline")
    parser.add_argument("--window", type=float, default=20.0, help="s of each window")
    parser.add_argument("--settle", type=float, default=3.0,
                        help="s from the disturbance to its window")
    parser.add_argument("--idle-streams", type=int, default=48)
    parser.add_argument("--idle-envs", type=int, default=64)
    parser.add_argument("--slow-factor", type=float, default=10.0)
    parser.add_argument("--restores", type=int, default=5)
    parser.add_argument("--restore-every", type=float, default=2.0, help="s between Restores")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a server setting (a tuned row)")
    parser.add_argument("--out", type=Path, default=Path("bench/results/fairness.json"))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    started = time.monotonic()
    mixes = []
    with tempfile.TemporaryDirectory(prefix="fairness-") as tmp:
        for name in args.mixes:
            print(f"{name} ...", file=sys.stderr, flush=True)
            mixes.append(run_mix(name, args, Path(tmp)))
    host_report.write_record(args.out, "bench/fairness.py", served.PACKAGES, {
        "settings": {key: value for key, value in vars(args).items() if key != "out"},
        "mixes": mixes,
        "runtime_s": round(time.monotonic() - started, 1),
    })  # fmt: skip
    print_table(mixes)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
