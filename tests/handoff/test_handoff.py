"""The handoff between front-end processes and the learner (service/handoff), through real
processes (multiprocessing's spawn): Acts and rollouts of many shapes and dtypes arrive byte for
byte, from several front ends at once; the limits refuse more, naming the setting; a front end
SIGKILLed mid-request has its slots reclaimed, and a learner that dies fails the front end's
waiters at once."""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pytest

from service.errors import InvalidInput, OverLimit, QueueFull, Unavailable
from service.handoff import Handoff, HandoffLimits, Hub, RolloutShape, SlotSizes
from service.handoff import layout as wire
from service.handoff.channel import SeatOp
from service.testing import handoff as harness
from service.testing.models import random_rollout
from service.types import ActMode
from tests.conftest import wait_until

SPAWN = multiprocessing.get_context("spawn")
MIB = 2**20
LIMITS = HandoffLimits(act_slots=4, act_rows=64, rollout_slots=3, rollout_bytes=MIB,
                       max_bytes=64 * MIB)  # fmt: skip


def shm_names() -> set[str]:
    return {name for name in os.listdir("/dev/shm") if "trident" in name or "handoff" in name}


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[tuple[harness.EchoLearner, Hub, str]]:
    """An EchoLearner's hub in this process, on a socket in tmp_path; /dev/shm as it was after."""
    before = shm_names()
    learner, path = harness.EchoLearner(), str(tmp_path / "learner.sock")
    hub = learner.serve(LIMITS, path, name=f"trident-test-{os.getpid()}")
    yield learner, hub, path
    hub.close()
    assert harness.memfd_maps(hub.name) == 0
    assert shm_names() <= before


def sizes(D: int, **changes: int) -> SlotSizes:
    return SlotSizes(**{**vars(LIMITS.sizes(D)), **changes})


def start(target: object, *args: object) -> tuple[multiprocessing.Process, object]:
    mine, theirs = SPAWN.Pipe()
    process = SPAWN.Process(target=target, args=(*args, theirs), daemon=True)
    process.start()
    theirs.close()
    return process, mine


# ------------------------------------------------------------------------------------ layout
def test_layout_is_aligned_and_its_prefix_does_not_depend_on_the_final_observations(
    rng: np.random.Generator,
) -> None:
    T, N, D, K = (int(n) for n in rng.integers(1, 40, 4))
    shapes = [RolloutShape(T, N, D, M, labels, K) for M in (0, 7) for labels in (False, True)]
    for shape in shapes:
        layout = shape.layout()
        assert all(field.offset % wire.ALIGN == 0 for field in layout.fields)
        assert layout.nbytes >= sum(field.nbytes for field in layout.fields)
        assert RolloutShape.unpack(shape.pack()) == shape
    fixed = {f.name: f for f in shapes[1].layout().fields if not f.name.startswith("final")}
    assert {f.name: f for f in shapes[3].layout().fields if f.name in fixed} == fixed


def test_a_rollout_written_into_its_views_reads_back_whole(rng: np.random.Generator) -> None:
    rollout = random_rollout(rng, T=int(rng.integers(1, 9)), N=int(rng.integers(1, 9)),
                             D=int(rng.integers(1, 9)), policy_version=3)  # fmt: skip
    layout = RolloutShape.of(rollout).layout()
    buffer = bytearray(layout.nbytes + wire.ALIGN)
    wire.write_rollout(layout.views(buffer, wire.ALIGN), rollout)
    back = wire.read_rollout(layout.views(buffer, wire.ALIGN), 3)
    assert back.digest() == rollout.digest()


# ------------------------------------------------------------------ bytes intact, concurrently
def test_acts_and_rollouts_from_several_front_ends_arrive_intact(
    hub: tuple[harness.EchoLearner, Hub, str], seed: int
) -> None:
    """Three front-end processes of four threads each: random Act rows, modes and ε, and
    rollouts of random shapes, with and without labels, in place and copied in; more requests
    than slots, so slots are reused while others are read."""
    learner, _, path = hub
    D = int(np.random.default_rng(seed).integers(1, 60))
    front_ends = [start(harness.front_end_main, path, sizes(D), seed + i, 4, 12, 8)
                  for i in range(3)]  # fmt: skip
    for process, conn in front_ends:
        assert conn.poll(120), "a front end did not finish"
        said = conn.recv()
        assert said["wrong"] == [] and said["acts"] == 48 and said["rollouts"] == 32, said
        process.join(30)
        assert process.exitcode == 0
    assert len(learner.digests) == 3 * 32
    wait_until(lambda: not hub[1].front_ends(), 30, "the front ends' slots reclaimed")


# ---------------------------------------------------------------------------------- the bounds
def test_slots_past_the_limits_are_refused_naming_the_setting(
    hub: tuple[harness.EchoLearner, Hub, str], rng: np.random.Generator
) -> None:
    _, server, path = hub
    D = int(rng.integers(1, 30))
    for change, setting in (({"act_rows": 65}, "server.handoff_act_rows = 64"),
                            ({"act_slots": 5}, "server.handoff_act_slots = 4"),
                            ({"rollout_slots": 4}, "server.handoff_rollout_slots = 3"),
                            ({"rollout_bytes": MIB + 1}, "server.max_rollout_mb = 1")):  # fmt: skip
        with pytest.raises(OverLimit, match=re.escape(setting)):
            Handoff.connect(path, sizes(D, **change))
    assert server.mapped_bytes == 0  # nothing was made for a refused front end
    # all front ends together: the first's slots fit, the second's would pass handoff_max_mb
    big = sizes(D, rollout_slots=3, rollout_bytes=MIB, act_slots=1, act_rows=1)
    count = LIMITS.max_bytes // big.total_bytes
    first = [Handoff.connect(path, big) for _ in range(count)]
    with pytest.raises(OverLimit, match=re.escape("server.handoff_max_mb = 64 MiB")):
        Handoff.connect(path, big)
    for handoff in first:
        handoff.close()
    wait_until(lambda: server.mapped_bytes == 0, 30, "the closed front ends' slots reclaimed")


def test_requests_past_a_slot_are_refused_naming_the_setting(
    hub: tuple[harness.EchoLearner, Hub, str], rng: np.random.Generator
) -> None:
    _, _, path = hub
    D = int(rng.integers(1, 30))
    handoff = Handoff.connect(path, sizes(D))
    with pytest.raises(OverLimit, match=re.escape("server.handoff_act_rows = 64")):
        handoff.act(np.zeros((65, D), np.float32), ActMode.SAMPLE)
    with pytest.raises(InvalidInput, match="obs"):
        handoff.act(np.zeros((3, D + 1), np.float32), ActMode.SAMPLE)
    N = MIB // (4 * D * 9) + 1  # 8 steps of N columns of D features: past one MiB
    with pytest.raises(OverLimit, match=re.escape("server.max_rollout_mb = 1 MiB")):
        handoff.submit_rollout(random_rollout(rng, T=8, N=N, D=D))
    assert handoff.slots_free() == {"act": 4, "rollout": 3}
    handoff.close()


def test_a_front_end_whose_slots_are_all_in_the_learners_hands_waits_then_is_refused(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    learner, path = harness.EchoLearner(hold=True), str(tmp_path / "learner.sock")
    server = learner.serve(LIMITS, path, name=f"trident-test-hold-{os.getpid()}")
    D = int(rng.integers(1, 30))
    handoff = Handoff.connect(path, sizes(D))
    rollouts = [random_rollout(rng, D=D) for _ in range(LIMITS.rollout_slots + 1)]
    futures = [handoff.submit_rollout(r, ("held", i)) for i, r in enumerate(rollouts[:-1])]
    with pytest.raises(QueueFull, match=re.escape("server.handoff_rollout_slots")):
        handoff.submit_rollout(rollouts[-1], timeout_s=0.05)
    late: Future[Future] = Future()
    threading.Thread(target=lambda: late.set_result(handoff.submit_rollout(rollouts[-1])),
                     daemon=True).start()  # fmt: skip
    wait_until(lambda: learner.release(), 30, "the held rollouts released")
    digests = [f.result(30).warnings[0] for f in futures]
    assert digests == [r.digest() for r in rollouts[:-1]]
    wait_until(lambda: learner.release() >= 0 and late.done() and late.result().done(), 30,
               "the waiting rollout sent and answered")  # fmt: skip
    assert late.result().result(30).warnings[0] == rollouts[-1].digest()
    handoff.close()
    server.close()
    wait_until(lambda: harness.memfd_maps(server.name) == 0, 30, "the segments unmapped")


# ---------------------------------------------------------------------------- process deaths
def test_a_front_end_killed_mid_request_has_its_slots_reclaimed(
    tmp_path: Path, seed: int
) -> None:
    before = shm_names()
    learner, path = harness.EchoLearner(hold=True), str(tmp_path / "learner.sock")
    server = learner.serve(LIMITS, path, name=f"trident-test-kill-{os.getpid()}")
    process, conn = start(harness.stuck_front_end_main, path, sizes(8), seed)
    assert conn.poll(60), "the front end did not fill its slots"
    said = conn.recv()
    held = said["rollouts"] + said["acts"]
    wait_until(lambda: len(learner.held) == held, 30, "its requests in the learner's hands")
    (info,) = server.front_ends()
    assert info.slots_busy == held and harness.memfd_maps(server.name) == 2
    os.kill(said["pid"], signal.SIGKILL)
    process.join(30)
    wait_until(lambda: not server.front_ends()[0].alive, 30, "the front end seen gone")
    assert not any(delivery.alive() for delivery in learner.deliveries)  # the queue drops them
    assert harness.memfd_maps(server.name) == 2  # the learner still reads them
    learner.release()
    wait_until(lambda: not server.front_ends(), 30, "its slots reclaimed")
    assert server.mapped_bytes == 0
    wait_until(lambda: harness.memfd_maps(server.name) == 0, 30, "its segments unmapped")
    # another front end gets the whole budget again
    learner.hold = False
    handoff = Handoff.connect(path, sizes(8))
    ones = np.ones((2, 8), np.float32)
    assert handoff.act(ones, ActMode.GREEDY_PI, timeout_s=30).values.tolist() == [8, 8]
    handoff.close()
    server.close()
    assert shm_names() <= before


def test_a_learner_that_dies_fails_the_front_ends_waiters(tmp_path: Path, rng: np.random.Generator
                                                          ) -> None:  # fmt: skip
    path = str(tmp_path / "learner.sock")
    process, conn = start(harness.learner_main, path, LIMITS, True)
    assert conn.poll(60) and conn.recv() == "ready"
    D = int(rng.integers(1, 30))
    handoff = Handoff.connect(path, sizes(D))
    rollout_future = handoff.submit_rollout(random_rollout(rng, D=D), ("dies", 0))
    act: Future[BaseException] = Future()

    def waiting_act() -> None:
        try:
            handoff.act(rng.standard_normal((5, D), dtype=np.float32), ActMode.SAMPLE)
        except BaseException as error:
            act.set_result(error)

    threading.Thread(target=waiting_act, daemon=True).start()
    wait_until(lambda: handoff.call("status", timeout_s=30)["held"] == 2, 30,
               "the rollout and the Act in the learner's hands")  # fmt: skip
    assert process.pid is not None
    os.kill(process.pid, signal.SIGKILL)
    error = act.result(timeout=30)
    assert isinstance(error, Unavailable) and "learner process closed" in str(error)
    with pytest.raises(Unavailable):
        rollout_future.result(timeout=30)
    with pytest.raises(Unavailable, match="learner process closed"):
        handoff.act(np.zeros((1, D), np.float32), ActMode.SAMPLE)
    with pytest.raises(Unavailable):
        handoff.submit_rollout(random_rollout(rng, D=D))
    handoff.close()
    process.join(30)


def test_a_learner_call_that_refuses_at_once_fails_the_request_and_frees_its_slot(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    def refuse(*_: object) -> Future:
        raise Unavailable("the server is draining and acts no more")

    path = str(tmp_path / "learner.sock")
    server = Hub(LIMITS, refuse, refuse, name=f"trident-test-refuse-{os.getpid()}")
    server.listen(path)
    D = int(rng.integers(1, 30))
    handoff = Handoff.connect(path, sizes(D))
    for _ in range(LIMITS.act_slots + 1):  # more than the slots: each came back
        with pytest.raises(Unavailable, match="draining"):
            handoff.act(rng.standard_normal((3, D), dtype=np.float32), ActMode.SAMPLE, timeout_s=30)
    for _ in range(LIMITS.rollout_slots + 1):
        with pytest.raises(Unavailable, match="draining"):
            handoff.submit_rollout(random_rollout(rng, D=D), timeout_s=30).result(30)
    assert handoff.slots_free() == {"act": LIMITS.act_slots, "rollout": LIMITS.rollout_slots}
    handoff.close()
    server.close()


def test_a_front_end_on_a_socketpair_is_served_and_its_end_reported(
    rng: np.random.Generator,
) -> None:
    """`Hub.adopt`: the server hands a new front-end process one end of a socketpair; `gone`
    names the front end once its end closes, and an unkeyed rollout comes without an actor."""
    gone: list[int] = []
    learner = harness.EchoLearner()
    server = Hub(LIMITS, learner.act, learner.step, gone=gone.append,
                 name=f"trident-test-pair-{os.getpid()}")  # fmt: skip
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server.adopt(ours)
    D = int(rng.integers(1, 30))
    handoff = Handoff(theirs, sizes(D))
    rollout = random_rollout(rng, D=D, extras=False)
    result = handoff.submit_rollout(rollout, stream=7).result(30)
    assert result.warnings == [rollout.digest(), "None", "0", "7"]
    (info,) = server.front_ends()
    assert info.pid == os.getpid() and info.alive and not gone
    handoff.close()
    wait_until(lambda: gone == [info.id] and not server.front_ends(), 30, "the front end gone")
    server.close()


def test_a_learner_that_never_answers_the_hello_is_reported(tmp_path: Path) -> None:
    path = str(tmp_path / "silent.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as silent:
        silent.bind(path)
        silent.listen(1)  # connections wait in the backlog, never answered
        with pytest.raises(Unavailable, match="did not answer"):
            Handoff.connect(path, sizes(4), timeout_s=0.2)
    with pytest.raises(Unavailable, match="no learner at"):
        Handoff.connect(path, sizes(4))


def test_seats_abandons_and_clients_reach_the_learner(rng: np.random.Generator) -> None:
    """SEAT messages reach the learner's `seat` in the order sent, before the stream's
    ROLLOUTs; a rollout's client and key arrive with it; QUEUED reaches the rollout's Future
    before its answer; an ABANDON turns that rollout's `alive()` False (its caller left), no
    other's, and its answer still frees the slot."""
    seats: list[tuple[int, int, SeatOp, int]] = []
    learner = harness.EchoLearner(hold=True)
    server = Hub(LIMITS, learner.act, learner.step, seat=lambda *m: seats.append(m),
                 name=f"trident-test-seat-{os.getpid()}")  # fmt: skip
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server.adopt(ours)
    D = int(rng.integers(1, 30))
    handoff = Handoff(theirs, sizes(D))
    handoff.seat(3, SeatOp.OPEN, 12)
    handoff.seat(3, SeatOp.WAIT)
    kept = handoff.submit_rollout(random_rollout(rng, D=D), ("actor-é", 9), stream=3,
                                  client="ipv4:127.0.0.1:5")  # fmt: skip
    left = handoff.submit_rollout(random_rollout(rng, D=D), client="x" * 2000)
    wait_until(lambda: len(learner.deliveries) == 2, 30, "both rollouts in the learner's hands")
    first, second = learner.deliveries
    assert (first.stream, first.actor, first.sequence) == (3, "actor-é", 9)
    assert first.client == "ipv4:127.0.0.1:5" and second.client == "x" * 512  # cut: MAX_CLIENT
    (front_end,) = [info.id for info in server.front_ends()]
    assert seats == [(front_end, 3, SeatOp.OPEN, 12), (front_end, 3, SeatOp.WAIT, 0)]
    assert not kept.queued.is_set()
    first.queued()  # the learner queued it: the front end hears so before its answer
    wait_until(kept.queued.is_set, 30, "QUEUED")
    assert not kept.done() and not left.queued.is_set()
    handoff.abandon(left.request)
    wait_until(lambda: not second.alive(), 30, "the abandoned rollout's caller gone")
    assert first.alive()
    handoff.seat(3, SeatOp.CLOSE)
    assert learner.release() == 2
    assert kept.result(30).warnings[1:] == ["actor-é", "9", "3"]
    left.result(30)  # the echo learner answers whatever it holds
    wait_until(lambda: handoff.slots_free()["rollout"] == LIMITS.rollout_slots, 30, "slots back")
    wait_until(lambda: len(seats) == 3, 30, "the CLOSE")
    handoff.close()
    server.close()
