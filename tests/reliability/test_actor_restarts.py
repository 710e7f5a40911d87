"""Actors ride through server restarts: 4 `trident actor` processes train one server that is
stopped 3 times (SIGKILL, a SIGTERM drain, SIGKILL) and each time restarted on its port from its
newest checkpoint (`serve --resume`). The server trains the actors' rollouts side by side, a few
a Step. The actors finish their rollout budget with exit 0, and every rollout they made is
either in the final state exactly once or counted as dropped for policy lag: the final
checkpoint's ledger holds, per actor, its rollouts less its drops; each of the final line's
Steps is made of ledger keys; and the replay holds exactly one rollout's transitions per key (a
rollout applied twice would hold two). Each actor says so at every outage: a line when the
server goes away, a line per reconnect attempt, and one when it is back whose resends add up to
the final line's."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import free_port, running_server, wait_until

from service.checkpoint import latest_checkpoint
from service.client.client import TridentClient
from service.testing.serverproc import ServerProcess, clean_env
from service.types import CheckpointInfo

pytestmark = pytest.mark.slow

ACTORS, STEPS, NUM_ENVS, T = 4, 24, 4, 8  # rollouts of T x NUM_ENVS env steps each
# Steps of 8 columns at least, 16 while all four streams are open: 2 to 4 rollouts a Step, so
# at least 24 Steps (96 rollouts) in the final line
KILL_AT = (4, 9, 14)  # global steps after which the server is stopped ...
STOPS = (signal.SIGKILL, signal.SIGTERM, signal.SIGKILL)  # ... by these signals
CARTPOLE = ("model.obs_dim=4", "model.num_actions=2", "model.aux_dim=0", "train.num_envs=8",
            "checkpoint.every_steps=2", "checkpoint.keep_last=2")  # fmt: skip
DONE = re.compile(r"^done: .*\| (?P<rollouts>\d+) rollouts, (?P<resent>\d+) resent, "
                  r"(?P<replayed>\d+) replayed, (?P<reconnects>\d+) reconnects \| durable: "
                  r"(?P<durable>\d+) of (?P<answered>\d+) answered in a checkpoint, "
                  r"(?P<not_yet>\d+) not yet")  # fmt: skip
STALE = re.compile(
    r"\((?P<applied>\d+) trained in \d+ Steps, (?P<dropped>\d+) dropped behind "
    r"the policy lag, (?P<ahead>\d+) dropped ahead of the server's state\)"
)

# The actor's lines about an outage: gone (A), each reconnect attempt (T), back (B); an actor
# that starts while the server is away says it waits (S) and when the server answered (N).
OUTAGE = {
    "S": re.compile(r"trident actor: no server at \S+ yet \("),
    "N": re.compile(r"trident actor: server at \S+ answered after [\d.]+ s \(\d+ attempts?\)$"),
    "A": re.compile(r"trident actor: server at \S+ unavailable \("),
    "T": re.compile(r"trident actor: reconnect attempt \d+ in [\d.]+ s \(backoff up to "),
    "B": re.compile(r"trident actor: server at \S+ back after [\d.]+ s \(\d+ attempts?\), "),
}
RESENT = re.compile(
    r": resent (?P<resent>\d+) rollouts?: (?P<trained>\d+) trained, (?P<replayed>\d+) "
    r"replayed \(already applied\), (?P<dropped>\d+) dropped"
)


def check_outage_lines(lines: list[str], reconnects: int, resent: int) -> None:
    """Each of the `reconnects` outages the final line counts was said: gone, one attempt or
    more, back (before them, the actor may have waited for the server to answer first); the
    resends the lines tell of (each trained, replayed or dropped) add up to
    the final line's `resent`."""
    said = "".join(kind for line in lines for kind, said in OUTAGE.items() if said.match(line))
    assert re.fullmatch(r"(ST+N)?(AT+B)*", said) and said.count("A") == reconnects, (said, lines)
    told = [found for line in lines if (found := RESENT.search(line))]
    assert sum(int(found["resent"]) for found in told) == resent, lines
    for found in told:
        outcomes = int(found["trained"]) + int(found["replayed"]) + int(found["dropped"])
        assert outcomes == int(found["resent"]), found[0]


def serve(tmp_path: Path, life: int, port: int) -> ServerProcess:
    return running_server(tmp_path / f"life-{life}", *CARTPOLE,
                          checkpoint_dir=tmp_path / "checkpoints",
                          extra_args=["--port", str(port), "--resume"])  # fmt: skip


def global_step(server: ServerProcess) -> int:
    with TridentClient(server.target, retries=0, timeout_s=5) as client:
        return client.status().global_step


def test_four_actors_ride_through_three_server_stops(tmp_path: Path) -> None:
    port = free_port()
    server = serve(tmp_path, 0, port)
    command = [sys.executable, "-m", "service.cli", "actor", "--server", server.target,
               "--env", "gymnasium:CartPole-v1", "--num-envs", str(NUM_ENVS), "--rollout-len",
               str(T), "--steps", str(STEPS), "--log-every", "1000",
               "--reconnect-timeout", "120"]  # fmt: skip
    pipes = {"env": clean_env(), "stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    actors = [
        subprocess.Popen([*command, "--seed", str(seed)], text=True, **pipes)
        for seed in range(ACTORS)
    ]
    try:
        for life, (threshold, stop) in enumerate(zip(KILL_AT, STOPS, strict=True), start=1):
            wait_until(lambda: global_step(server) >= threshold, 120,  # noqa: B023
                       f"global step {threshold} before stop {life}")  # fmt: skip
            server.proc.send_signal(stop)
            assert server.proc.wait(30) in (0, -signal.SIGKILL)
            server = serve(tmp_path, life, port)
        outputs = [actor.communicate(timeout=300) for actor in actors]
        with TridentClient(server.target) as client:
            replay_size, reached = client.status().replay_size, client.status().global_step
    finally:
        for actor in actors:
            actor.kill()
        returncode = server.terminate()
    assert returncode == 0, server.stderr()[-3000:]

    counts = actor_counts(actors, outputs)
    # The drain's final checkpoint, or (when the last periodic one holds every Step) none: the
    # newest checkpoint holds the last state either way.
    final, ledger, applied = applied_once(tmp_path / "checkpoints", reached, counts)
    for figures in counts.values():
        # The final checkpoint holds every applied Step; the actor saw those the periodic
        # ones held, and its count adds up.
        assert figures["durable"] + figures["not_yet"] == figures["answered"], figures
    steps = {entry["result"]["global_step"] for entry in ledger["applied"]}
    assert steps == set(range(1, final.global_step + 1))  # every Step of the final line
    assert replay_size == sum(applied.values()) * T * NUM_ENVS  # each key's rollout once
    print(f"\n[restarts] {ACTORS} actors x {STEPS} rollouts through 3 stops (KILL, TERM, KILL): "
          f"{sum(applied.values())} rollouts applied once in {final.global_step} Steps, "
          f"{sum(f['dropped'] + f['ahead'] for f in counts.values())} dropped for lag, "
          f"{sum(f['resent'] for f in counts.values())} resent, "
          f"{sum(f['replayed'] for f in counts.values())} answered from the ledger, "
          f"{sum(f['reconnects'] for f in counts.values())} reconnects")  # fmt: skip
    assert sum(f["reconnects"] for f in counts.values()) >= len(KILL_AT)


def actor_counts(actors: list[subprocess.Popen[str]], outputs: list[tuple[str, str]]
                 ) -> dict[str, dict[str, int]]:  # fmt: skip
    """Each `trident actor`'s figures from its done line, by actor id, once it exited 0 with
    nothing on stderr and its outage lines add up."""
    counts = {}
    for actor, (out, err) in zip(actors, outputs, strict=True):
        assert actor.returncode == 0 and not err.strip(), (actor.returncode, err[-3000:])
        actor_id = re.search(r"\| actor id (\S+)", out).group(1)  # type: ignore[union-attr]
        done = out.strip().splitlines()[-1]
        figures = {**DONE.match(done).groupdict(), **STALE.search(done).groupdict()}  # type: ignore[union-attr]
        counts[actor_id] = {key: int(value) for key, value in figures.items()}
        check_outage_lines(out.splitlines(), counts[actor_id]["reconnects"],
                           counts[actor_id]["resent"])  # fmt: skip
    return counts


def applied_once(checkpoints: Path, reached: int, counts: dict[str, dict[str, int]]
                 ) -> tuple[CheckpointInfo, dict[str, Any], Counter[str]]:  # fmt: skip
    """The newest checkpoint (at step `reached`), its ledger and the Steps it applied per actor:
    each actor's rollouts less those dropped for lag, none forgotten."""
    final = latest_checkpoint(checkpoints)
    assert final is not None and final.global_step == reached, (final, reached)
    ledger = json.loads((final.path / "ledger.json").read_text())
    applied = Counter(entry["actor"] for entry in ledger["applied"])
    assert not ledger["forgotten"]  # the window held every key: the ledger is the whole story
    for actor_id, figures in counts.items():
        dropped = figures["dropped"] + figures["ahead"]
        assert applied[actor_id] == figures["rollouts"] - dropped, (actor_id, figures)
    return final, ledger, applied


def test_an_actor_stops_when_the_server_comes_back_with_another_model(tmp_path: Path) -> None:
    """After a restart the actor reads the model shape again: a server back with a model the
    env does not fit stops it with exit 2 and the --set flags that would fit."""
    port = free_port()
    server = serve(tmp_path, 0, port)
    actor = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "actor", "--server", server.target,
         "--env", "gymnasium:CartPole-v1", "--num-envs", "2", "--rollout-len", "4",
         "--steps", "100000", "--reconnect-timeout", "120"],
        env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_until(lambda: global_step(server) >= 2, 120, "two Steps from the actor")
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait(30)
        other = running_server(tmp_path / "other", "model.obs_dim=5", "model.num_actions=2",
                               extra_args=["--port", str(port)])  # fmt: skip
        with other:
            _, err = actor.communicate(timeout=120)
    finally:
        actor.kill()
    assert actor.returncode == 2, err[-3000:]
    assert "model.obs_dim = 5, the env needs 4" in err and "--set model.obs_dim=4" in err, err
