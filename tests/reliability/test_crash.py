"""Crash consistency of checkpoints on a real server, over gRPC.

SIGKILL at random moments of a stream of Checkpoint RPCs, trial after trial on one checkpoint
directory: every restart removes the temporaries at start-up, lists committed checkpoints only,
and its newest one restores with the step and parameter digest it was saved with. "Committed"
is the rename of the temporary directory: the newest checkpoint is the last one whose
Checkpoint RPC answered OK, or the one in flight at the kill if its rename had happened, and
never the one whose temporary the kill left behind.

A flipped bit in any file of a checkpoint makes Restore answer DATA_LOSS naming the file, with
the parameters untouched, while the previous good checkpoint still restores.

The CI runs TRIDENT_CRASH_TRIALS (default 16) trials at random moments; where none of them
landed inside a save (0 of 16 in a clean-clone CI run on a 2-vCPU EPYC; 3-8 of 16 there in
runs alone), up to AIMED_TRIALS more are aimed, each killing the server as soon as the save's
temporary appears, so that a kill mid-save is always among those checked. The long run is

    TRIDENT_CRASH_TRIALS=200 TRIDENT_CRASH_RESULTS=bench/results/crash_trials.json \\
        python -m pytest tests/reliability/test_crash.py -k sigkill -s
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import os
import platform
import random
import shlex
import statistics
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
import pytest
from conftest import SMALL, fresh_seed, random_rollout, running_server, wait_until

from service.checkpoint import MANIFEST, TEMP_PREFIX, read_manifest
from service.client.client import TridentClient
from service.testing.serverproc import ServerProcess
from service.types import Rollout

Code = grpc.StatusCode
TRIALS = int(os.environ.get("TRIDENT_CRASH_TRIALS") or 16)
RESULTS = os.environ.get("TRIDENT_CRASH_RESULTS")  # where the run's figures go as JSON, if set
SETTINGS = ("checkpoint.keep_last=3", "replay.capacity=512")
# The kill comes 0 to a window (uniform) after the 1st to 3rd Checkpoint RPC is sent. Every
# other trial the window is KILL_WINDOW_S, so kills fall before, in and after saves; in the
# others it is 1.5 times the median Checkpoint round trip measured so far, so most of those
# kills land inside a save whatever the machine's speed and however long a Step takes next
# to a save (a save takes ~10 ms on an idle 2-core machine).
KILL_WINDOW_S = 0.04
AIMED_TRIALS = 5  # at most, after the random ones, until a kill lands mid-save
FLIPS_PER_FILE = 3


@dataclass(frozen=True)
class Saved:
    """What a checkpoint holds: the global step and parameter digest just before its save."""

    step: int
    digest: str


@dataclass
class Life:
    """One server process's traffic until its SIGKILL."""

    pid: int
    attempted: list[str] = field(default_factory=list)  # Checkpoint RPCs sent, in order
    answered: list[str] = field(default_factory=list)  # ... and answered OK
    round_trips: list[float] = field(default_factory=list)  # seconds of the answered ones
    ended_by: str = ""  # the status code that ended the traffic

    @property
    def in_flight(self) -> str | None:
        """The checkpoint whose RPC the kill cut short, if one was."""
        if self.attempted and self.attempted[-1] not in self.answered:
            return self.attempted[-1]
        return None


def traffic(
    server: ServerProcess, trial: int, rollout: Rollout, saved: dict[str, Saved], life: Life
) -> None:
    """Step on `rollout`, read the digest, checkpoint; again and again until the server is
    killed."""
    with TridentClient(server.target, retries=0, timeout_s=10) as client:
        try:
            for index in itertools.count():
                client.step(rollout)
                status = client.status()
                name = f"t{trial:04d}-c{index:04d}"
                saved[name] = Saved(status.global_step, status.param_digest)
                life.attempted.append(name)
                sent = time.perf_counter()
                client.checkpoint(name)
                life.round_trips.append(time.perf_counter() - sent)
                life.answered.append(name)
        except grpc.RpcError as error:
            life.ended_by = error.code().name


def wait_for_temporary(root: Path, life: Life, worker: threading.Thread) -> None:
    """Until the temporary of the Checkpoint in flight is on disk (its save has begun)."""

    def save_begun() -> bool:
        name = life.in_flight
        return name is not None and any(root.glob(f"{TEMP_PREFIX}{name}-{life.pid}-*"))

    wait_until(lambda: save_begun() or not worker.is_alive(), 30,
               lambda: f"a save's temporary in {root}: {life}", interval_s=0.0002)  # fmt: skip


def wait_for_attempts(life: Life, count: int, worker: threading.Thread) -> None:
    """Until `count` Checkpoint RPCs have been sent, or the traffic has ended."""
    wait_until(
        lambda: len(life.attempted) >= count or not worker.is_alive(),
        30,
        lambda: f"{count} Checkpoint RPCs sent: {life}",
        interval_s=0.0005,
    )


@dataclass
class Tally:
    """What the kills hit and what the restarts found."""

    kills: Counter[str] = field(default_factory=Counter)
    prune_leftovers: int = 0  # temporaries of pruned checkpoints (killed mid-prune)
    removed_at_startup: int = 0
    restores: int = 0


def classify(root: Path, life: Life, saved: dict[str, Saved], tally: Tally) -> list[str]:
    """Sort the kill by what it cut short; the temporaries it left (each one accounted for)."""
    temporaries = sorted(p.name for p in root.glob(f"{TEMP_PREFIX}*"))
    ours = {t for t in temporaries if t.startswith(f"{TEMP_PREFIX}{life.in_flight}-{life.pid}-")}
    # The rest are pruned checkpoints caught between their rename and their removal:
    # .tmp-<name>-<pid>-<random>, of a checkpoint this test saved.
    for temporary in set(temporaries) - ours:
        name, pid, _ = temporary.removeprefix(TEMP_PREFIX).rsplit("-", 2)
        assert name in saved and name != life.in_flight and pid == str(life.pid), temporaries
        tally.prune_leftovers += 1
    if life.in_flight is None:
        tally.kills["between saves"] += 1
    elif ours:
        tally.kills["mid-save (temporary left)"] += 1
    elif (root / life.in_flight).is_dir():
        tally.kills["after the rename (reply lost)"] += 1
    else:
        tally.kills["before the save began"] += 1
    return temporaries


def check_restart(
    server: ServerProcess,
    life: Life,
    temporaries: list[str],
    committed: set[str],
    saved: dict[str, Saved],
    tally: Tally,
) -> str | None:
    """The restarted server removed the temporaries at start-up and lists committed checkpoints
    only, the newest first; that one restores as saved. Its name (None: none committed yet)."""
    removed = server.events("removed uncommitted checkpoints")
    assert sum(e["count"] for e in removed) == len(temporaries), (removed, temporaries)
    assert not list(server.checkpoint_dir.glob(f"{TEMP_PREFIX}*"))
    tally.removed_at_startup += len(temporaries)
    in_flight = life.in_flight
    left = [t for t in temporaries if in_flight and t.startswith(f"{TEMP_PREFIX}{in_flight}-")]
    # The last checkpoint answered OK in this life or before (names sort in the order sent).
    last_answered = max(committed, default=None)
    with TridentClient(server.target, timeout_s=30) as client:
        listed = [c.name for c in client.list_checkpoints()]
        assert set(listed) <= committed | {in_flight}, (listed, life)
        if left:
            assert in_flight not in listed  # its rename never happened
            with pytest.raises(grpc.RpcError) as caught:  # and a temporary is never a name
                client.restore(left[0])
            assert caught.value.code() == Code.INVALID_ARGUMENT
        if last_answered is not None:
            assert last_answered in listed, (listed, life)
        if not listed:
            return None
        assert listed[0] in {last_answered, in_flight}, (listed, life)
        reply = client.restore(listed[0])
        expected = saved[listed[0]]
        assert (reply.checkpoint.global_step, reply.param_digest) == (
            expected.step,
            expected.digest,
        )
        assert client.status().global_step == expected.step
    tally.restores += 1
    return listed[0]


def machine() -> dict[str, object]:
    model = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.partition(":")[2].strip()
            break
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "cpu_model": model,
    }


@pytest.mark.slow
def test_sigkill_at_random_moments_of_checkpoint_saves(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seed = fresh_seed()
    chooser = random.Random(seed)
    root = tmp_path / "checkpoints"
    saved: dict[str, Saved] = {}
    committed: set[str] = set()  # answered OK, or found committed after the kill
    tally = Tally()
    life: Life | None = None
    round_trips: list[float] = []  # of every answered Checkpoint so far
    temporaries: list[str] = []
    load_before = os.getloadavg()
    started = time.perf_counter()
    aimed = 0
    for trial in itertools.count():  # each start checks the previous trial's kill
        server = running_server(tmp_path / "server", *SETTINGS, checkpoint_dir=root)
        try:
            if life is not None:
                newest = check_restart(server, life, temporaries, committed, saved, tally)
                if newest is not None:  # the in-flight one, if its rename had happened
                    committed.add(newest)
            mid_save_seen = tally.kills["mid-save (temporary left)"] > 0
            if trial >= TRIALS and (mid_save_seen or aimed == AIMED_TRIALS):
                break
            life = Life(server.proc.pid)
            rollout = random_rollout(np.random.default_rng([seed, trial]), T=4, N=4)
            worker = threading.Thread(target=traffic, args=(server, trial, rollout, saved, life))
            worker.start()
            wait_for_attempts(life, chooser.randint(1, 3), worker)
            if trial >= TRIALS:
                aimed += 1
                wait_for_temporary(root, life, worker)
            else:
                window = KILL_WINDOW_S
                if trial % 2 and round_trips:
                    window = 1.5 * statistics.median(round_trips)
                time.sleep(chooser.uniform(0, window))
            server.proc.kill()
            assert server.proc.wait(10) == -9
            worker.join(30)
        finally:
            server.terminate()
        assert not worker.is_alive() and life.ended_by == "UNAVAILABLE", life
        committed.update(life.answered)
        round_trips += life.round_trips
        temporaries = classify(root, life, saved, tally)
    seconds = time.perf_counter() - started

    mid_save = tally.kills["mid-save (temporary left)"]
    figures = {
        "trials": TRIALS,
        "aimed_trials": aimed,
        "seed": seed,
        "kills": dict(tally.kills),
        "mid_save_kills": mid_save,
        "prune_leftovers": tally.prune_leftovers,
        "temporaries_removed_at_startup": tally.removed_at_startup,
        "restores": tally.restores,
        "checkpoints_attempted": len(saved),
        "seconds": round(seconds, 1),
    }
    kills = ", ".join(f"{count} {moment}" for moment, count in sorted(tally.kills.items()))
    with capsys.disabled():
        print(
            f"\n[crash] {TRIALS} + {aimed} aimed SIGKILLs ({kills}); "
            f"{tally.removed_at_startup} temporaries removed at start-up "
            f"({tally.prune_leftovers} of prunes); {tally.restores} newest checkpoints restored "
            f"with their step and digest; {len(saved)} saves attempted; "
            f"{seconds:.1f} s (seed {seed})"
        )
    if RESULTS:
        command = shlex.join(["python", "-m", "pytest", *sys.argv[1:]])
        record = {
            "command": f"TRIDENT_CRASH_TRIALS={TRIALS} TRIDENT_CRASH_RESULTS={RESULTS} {command}",
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "machine": machine(),
            "load_average_1_5_15_min": {"start": load_before, "end": os.getloadavg()},
            "settings": [*SMALL, *SETTINGS],
            "kill_window_s": KILL_WINDOW_S,  # on even trials; odd: 1.5 x median round trip
            "checkpoint_round_trip_median_s": statistics.median(round_trips),
            **figures,
        }
        Path(RESULTS).write_text(json.dumps(record, indent=1) + "\n")
    assert sum(tally.kills.values()) == TRIALS + aimed
    assert mid_save > 0 and tally.restores > 0, figures


def flip(path: Path, position: int, mask: int) -> None:
    """XOR one byte of a file in place (the same flip again undoes it)."""
    data = bytearray(path.read_bytes())
    data[position] ^= mask
    path.write_bytes(bytes(data))


def test_flipped_bit_in_any_file_is_data_loss(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chooser = random.Random(fresh_seed())
    rollout = random_rollout(np.random.default_rng(chooser.randrange(2**32)), T=4, N=4)
    with running_server(tmp_path, *SETTINGS) as server, TridentClient(server.target) as client:
        client.step(rollout)
        client.checkpoint("good")
        good = client.status()
        client.step(rollout)
        client.checkpoint("flipped")
        saved = client.status()
        client.step(rollout)  # the live state differs from both checkpoints
        live = client.status()
        directory = server.checkpoint_dir / "flipped"
        files = [*read_manifest(directory)["files"], MANIFEST]
        refused = 0
        for filename in files:
            path = directory / filename
            for _ in range(FLIPS_PER_FILE):
                position = chooser.randrange(path.stat().st_size)
                mask = 1 << chooser.randrange(8)
                flip(path, position, mask)
                with pytest.raises(grpc.RpcError) as caught:
                    client.restore("flipped")
                error = caught.value
                assert error.code() == Code.DATA_LOSS, (filename, position, error.details())
                assert filename in error.details(), (filename, error.details())
                now = client.status()
                assert (now.param_digest, now.global_step) == (live.param_digest, live.global_step)
                refused += 1
                flip(path, position, mask)
        flip(directory / files[-1], 0, 1)  # still corrupt: the previous good one restores
        reply = client.restore("good")
        assert (reply.param_digest, reply.checkpoint.global_step) == (
            good.param_digest,
            good.global_step,
        )
        flip(directory / files[-1], 0, 1)  # undone: the flips were the only damage
        assert client.restore("flipped").param_digest == saved.param_digest
    with capsys.disabled():
        print(
            f"\n[crash] {refused} one-bit flips over {len(files)} files "
            f"({', '.join(files)}): all DATA_LOSS naming the file, parameters untouched; "
            "the previous checkpoint restored"
        )
