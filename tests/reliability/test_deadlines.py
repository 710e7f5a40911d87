"""Deadlines: a Step whose deadline expires is abandoned before it touches the trainer, or
completes whole, never half; 1,000 expired or cancelled calls leak no threads and no memory."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import grpc
import numpy as np
from conftest import random_rollout, running_server, small_config, wait_until

from service.api.tensors import encode
from service.api.trident.v1 import trainer_pb2 as pb
from service.api.trident.v1 import trainer_pb2_grpc as pb_grpc
from service.client.client import TridentClient, step_request
from service.server.admission import handler_threads
from service.testing.serverproc import ServerProcess
from service.trainer.trainer import Trainer

Code = grpc.StatusCode


def status_of(client: TridentClient) -> pb.GetStatusResponse:
    """GetStatus, retried while the server is at its concurrent-RPC limit."""

    def answered() -> pb.GetStatusResponse | None:
        try:
            return client.status()
        except grpc.RpcError as error:
            if error.code() != Code.RESOURCE_EXHAUSTED:
                raise
            return None

    return wait_until(answered, 10, "GetStatus below the concurrent-RPC limit", interval_s=0.05)


def settle(client: TridentClient, timeout: float = 30.0) -> pb.GetStatusResponse:
    """GetStatus once the queue is empty and global_step has stopped moving."""
    deadline = time.monotonic() + timeout
    last = status_of(client)
    while time.monotonic() < deadline:
        time.sleep(0.1)
        status = status_of(client)
        if status.step_queue_depth == 0 and status.global_step == last.global_step:
            return status
        last = status
    raise AssertionError(f"server still busy after {timeout} s: {last}")


def outcome(future: grpc.Future) -> str:
    """The status name a call future ended with (OK, DEADLINE_EXCEEDED, CANCELLED, ...)."""
    if future.cancelled():
        return "CANCELLED"
    error = future.exception()
    return "OK" if error is None else error.code().name


def test_expired_steps_are_abandoned_or_applied_whole(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    settings = ("ppo.epochs=16", "server.step_queue_size=48")  # Steps of tens of ms
    rollout = random_rollout(rng, T=8, N=8)
    request = step_request(rollout)
    with running_server(tmp_path, *settings) as server, TridentClient(server.target) as client:
        before = client.status()
        stub = client.stub
        # Deadlines from 1 ms to ~0.5 s against Steps of ~0.1 s each: most expire in the queue
        # (abandoned), some mid-Step (applied whole, the reply lost); three patient ones last.
        deadlines = [0.001 * 1.15**i for i in range(45)] + [30.0] * 3
        futures = [stub.Step.future(request, timeout=timeout) for timeout in deadlines]
        codes = Counter(outcome(future) for future in futures)
        status = settle(client)
        server_events = server.events("rejected")

    applied = status.global_step
    assert set(codes) <= {"OK", "DEADLINE_EXCEEDED"}, codes
    assert codes["DEADLINE_EXCEEDED"] >= 30 and codes["OK"] >= 3, codes
    assert codes["OK"] <= applied < len(futures), (codes, applied)  # some were abandoned
    abandoned = [e for e in server_events if e["method"] == "Step" and e["code"] == "CANCELLED"]
    assert abandoned and applied + len(abandoned) <= len(futures)
    # Every Step sent the same rollout, so the state after `applied` whole Steps is known.
    trainer = Trainer(small_config(*settings))
    assert trainer.param_digest() == before.param_digest
    for _ in range(applied):
        trainer.step(rollout)
    assert status.param_digest == trainer.param_digest()
    assert status.replay_size == len(trainer.state.replay)


def proc_status(server: ServerProcess) -> tuple[int, int, int]:
    """The server's Python-made threads, its gRPC-core threads and its resident set in bytes.

    Python 3.11/3.12 leave a new thread with its creator's OS name, while gRPC core names its
    own (event_engine, grpc_global_tim, ...): a thread named like the main thread is Python's."""
    tasks = Path(f"/proc/{server.proc.pid}/task")
    main_name = (tasks / str(server.proc.pid) / "comm").read_text()
    names = [(task / "comm").read_text() for task in tasks.iterdir()]
    python_threads = names.count(main_name)
    rss_kib = next(
        line.split()[1]
        for line in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines()
        if line.startswith("VmRSS:")
    )
    return python_threads, len(names) - python_threads, int(rss_kib) * 1024


def abandon_calls(server: ServerProcess, count: int, rng: np.random.Generator) -> Counter[str]:
    """`count` Steps and Acts in waves of 24, each with a 1-5 ms deadline or cancelled at once."""
    step = step_request(random_rollout(rng, T=2, N=2))
    obs = rng.standard_normal((3, 6)).astype("<f4")
    act = pb.ActRequest(obs=encode(obs), mode=pb.ACT_MODE_SAMPLE)
    codes: Counter[str] = Counter()
    with grpc.insecure_channel(server.target) as channel:
        stub = pb_grpc.TrainerServiceStub(channel)
        for start in range(0, count, 24):
            wave = []
            for i in range(start, min(start + 24, count)):
                method, request = (stub.Step, step) if i % 2 else (stub.Act, act)
                if i % 5 == 0:
                    future = method.future(request, timeout=10)
                    future.cancel()
                else:
                    future = method.future(request, timeout=0.001 * (1 + i % 5))
                wave.append(future)
            codes.update(outcome(future) for future in wave)
    return codes


def test_a_thousand_abandoned_calls_leak_no_threads_or_memory(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    # The handler pool grows one thread per call that finds none idle, up to handler_threads
    # (a thread per call each admission bound lets in, and health's); its last few threads come
    # only from rare races, so the pool may still grow after any warm-up. A leak is growth past
    # that bound.
    settings = ("replay.capacity=256", "server.max_concurrent_rpcs=16", "server.max_streams=4",
                "server.max_control_rpcs=4")  # fmt: skip
    pool_bound = handler_threads(small_config(*settings).server)
    with running_server(tmp_path, *settings) as server, TridentClient(server.target) as client:
        settle(client)
        python_fresh, _, _ = proc_status(server)  # the pool's first thread ran settle's calls
        abandon_calls(server, 600, rng)  # warm-up: thread pool, caches, replay filled
        settle(client)
        python_before, core_before, rss_before = proc_status(server)
        codes = abandon_calls(server, 1000, rng)
        status = settle(client)
        bound, core_bound = python_fresh + pool_bound - 1, core_before + 2

        def within_bounds() -> tuple[int, int, int] | None:
            """proc_status once both thread counts are within their bounds (the handlers of
            dropped Steps return a moment after their callers gave up)."""
            found = proc_status(server)
            return found if found[0] <= bound and found[1] <= core_bound else None

        python_after, core_after, rss_after = wait_until(
            within_bounds,
            10,
            lambda: f"threads within {bound} Python, {core_bound} core: {proc_status(server)}",
        )
        # Still consistent and serving: a plain Step lands on top of the applied ones.
        reply = client.step(random_rollout(rng, T=2, N=2))
        assert reply.global_step == status.global_step + 1

    assert sum(codes.values()) == 1000
    # The calls did end early: cancelled, past their deadline, or refused by a full queue (the
    # split between the last two follows the machine's load: 278 / 518 on a busy 2-core VM).
    unanswered = codes["DEADLINE_EXCEEDED"] + codes["RESOURCE_EXHAUSTED"]
    assert codes["CANCELLED"] >= 150 and unanswered >= 400, codes
    drift = (rss_after - rss_before) / 2**20
    assert drift < 10, f"RSS grew {drift:.1f} MiB over 1,000 abandoned calls"
    print(
        f"{codes}; Python threads {python_fresh} fresh, {python_before}->{python_after} "
        f"(bound {bound}); gRPC core threads {core_before}->{core_after}; "
        f"RSS drift {drift:+.2f} MiB"
    )
