"""Message size limit to the byte: `server.max_message_mb` MiB is read, one byte more is refused
with RESOURCE_EXHAUSTED and changes nothing.

The other limit, a full Step queue answering RESOURCE_EXHAUSTED at once while a later Step
succeeds, is covered by test_full_step_queue_is_resource_exhausted_at_once in
tests/test_server_errors.py and is not repeated here.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import numpy as np
import pytest
from serverproc import ServerProcess, random_rollout, running_server

from service.api.tensors import encode
from service.api.trident.v1 import trainer_pb2 as pb
from service.api.trident.v1 import trainer_pb2_grpc as pb_grpc
from service.client.client import step_request

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


def base(method: str) -> Request:
    if method == "Step":
        return step_request(random_rollout(np.random.default_rng(0)))
    return pb.ActRequest(obs=encode(np.zeros((4, 6), np.float32)))


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
def test_one_byte_over_the_limit_is_resource_exhausted(server: ServerProcess, method: str) -> None:
    before = digest(server)
    # Exactly at the limit the message is read: the padded obs is then the wrong size.
    assert call(server, method, padded(base(method), LIMIT)) == grpc.StatusCode.INVALID_ARGUMENT
    assert call(server, method, padded(base(method), LIMIT + 1)) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED
    )
    assert digest(server) == before
    # The server still serves normal requests.
    assert call(server, method, base(method)) == grpc.StatusCode.OK
