"""Limits: the message size to the byte (`server.max_message_mb` MiB is read, one byte more is
refused with RESOURCE_EXHAUSTED and changes nothing), and a full Step queue (a client's Step
beyond its first queued one gets RESOURCE_EXHAUSTED at once, a later one succeeds)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
from conftest import random_rollout, running_server, wait_until

from service.api.tensors import encode
from service.api.trident.v1 import trainer_pb2 as pb
from service.api.trident.v1 import trainer_pb2_grpc as pb_grpc
from service.client.client import TridentClient, step_request
from service.testing.serverproc import ServerProcess

Code = grpc.StatusCode

MAX_MB = 1
LIMIT = MAX_MB * 1024 * 1024
Request = pb.StepRequest | pb.ActRequest


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("limits")
    with running_server(tmp, f"server.max_message_mb={MAX_MB}") as server:
        yield server


def padded(request: Request, size: int) -> Request:
    """`request` with its obs bytes padded so that it serializes to exactly `size` bytes."""
    request.obs.data += bytes(max(0, size - request.ByteSize()))
    while request.ByteSize() > size:  # a varint length may have grown by a byte
        request.obs.data = request.obs.data[:-1]
    assert request.ByteSize() == size
    return request


def base(method: str, rng: np.random.Generator) -> Request:
    if method == "Step":
        return step_request(random_rollout(rng))
    return pb.ActRequest(obs=encode(rng.standard_normal((4, 6)).astype(np.float32)))


def call(server: ServerProcess, method: str, request: Request) -> grpc.StatusCode:
    with grpc.insecure_channel(server.target) as channel:
        stub = pb_grpc.TrainerServiceStub(channel)
        try:
            getattr(stub, method)(request, timeout=30)
        except grpc.RpcError as error:
            return error.code()
        return grpc.StatusCode.OK


def digest(server: ServerProcess) -> tuple[str, int]:
    with grpc.insecure_channel(server.target) as channel:
        status = pb_grpc.TrainerServiceStub(channel).GetStatus(pb.GetStatusRequest(), timeout=30)
    return status.param_digest, status.global_step


@pytest.mark.parametrize("method", ["Step", "Act"])
def test_one_byte_over_the_limit_is_resource_exhausted(
    server: ServerProcess, method: str, rng: np.random.Generator
) -> None:
    before = digest(server)
    # Exactly at the limit the message is read: the padded obs is then the wrong size.
    at_limit = padded(base(method, rng), LIMIT)
    assert call(server, method, at_limit) == grpc.StatusCode.INVALID_ARGUMENT
    assert call(server, method, padded(base(method, rng), LIMIT + 1)) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED
    )
    assert digest(server) == before
    # The server still serves normal requests.
    assert call(server, method, base(method, rng)) == grpc.StatusCode.OK


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server whose Steps take a while and whose Step queue holds one of 16 columns."""
    tmp = tmp_path_factory.mktemp("backpressure")
    with running_server(tmp, "server.step_queue_size=1", "train.num_envs=16",
                        "ppo.epochs=100") as server:  # fmt: skip
        yield server


def test_full_step_queue_is_resource_exhausted_at_once(
    slow: ServerProcess, rng: np.random.Generator, capsys: pytest.CaptureFixture[str]
) -> None:
    callers = 6  # threads of one client (one connection): the queue's room is shared by clients
    rollouts = [random_rollout(rng, T=16, N=16) for _ in range(callers)]
    start = threading.Barrier(callers)
    outcomes: list[tuple[Code, str, bool] | None] = [None] * callers
    answered: list[int] = []  # callers in the order their answers came

    def call(client: TridentClient, i: int) -> None:
        request = step_request(rollouts[i])
        request_id = uuid.uuid4().hex
        start.wait()
        try:
            client.stub.Step(request, metadata=(("x-request-id", request_id),), timeout=60)
            code, details, echoed = Code.OK, "", request_id
        except grpc.RpcError as error:
            code, details = error.code(), error.details()
            echoed = dict(error.trailing_metadata() or ()).get("x-request-id")
        outcomes[i] = (code, details, echoed == request_id)
        answered.append(i)

    with TridentClient(slow.target) as shared:
        shared.health()  # connect first, so that every Step leaves at once
        threads = [threading.Thread(target=call, args=(shared, i)) for i in range(callers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    assert all(outcome is not None for outcome in outcomes)
    done = [i for i, o in enumerate(outcomes) if o[0] == Code.OK]
    full = [i for i, o in enumerate(outcomes) if o[0] == Code.RESOURCE_EXHAUSTED]
    assert len(done) + len(full) == callers, outcomes
    assert done and full, outcomes  # one applying, one queued, the others turned away
    # At once: every refusal was answered before the first Step that was applied.
    first_applied = min(answered.index(i) for i in done)
    assert all(answered.index(i) < first_applied for i in full), (answered, outcomes)
    assert all("step queue full" in outcomes[i][1] and "this client already has 1 queued"
               in outcomes[i][1] and outcomes[i][2] for i in full), outcomes  # fmt: skip
    with capsys.disabled():
        print(
            f"\n[limits] {callers} simultaneous Steps into a queue of 1: {len(done)} OK, "
            f"{len(full)} RESOURCE_EXHAUSTED, each before the first OK; each retried later "
            "and applied"
        )

    # Backing off and retrying gets every rejected Step applied, each exactly once.
    with TridentClient(slow.target) as client:

        def accepted() -> bool:
            try:
                client.step(random_rollout(rng, T=4, N=4))
            except grpc.RpcError as error:
                assert error.code() == Code.RESOURCE_EXHAUSTED
                return False
            return True

        for _ in full:
            wait_until(accepted, 60, "a retried Step accepted", interval_s=0.05)
        assert client.status().global_step == callers
