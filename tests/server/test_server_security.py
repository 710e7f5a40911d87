"""A token server's open parts (health, the CLI, denial metrics, request ids) and a port in use.

Authentication itself (bad tokens, hmac.compare_digest, TLS, mTLS, settings that must stop the
server before it binds) is tests/reliability/test_auth.py."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from conftest import random_rollout, running_server

from service.api.trident.v1 import trainer_pb2 as pb
from service.api.trident.v1 import trainer_pb2_grpc as pb_grpc
from service.client.client import TridentClient
from service.testing.serverproc import ServerProcess, scrape, trident_cli, value

Code = grpc.StatusCode
TOKEN = "secret"


# ------------------------------------------------------------------------------ token
@pytest.fixture(scope="module", params=[0, 2], ids=["one-process", "front-ends"])
def token_server(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[ServerProcess]:
    """In one process, and with the token checked in front-end processes."""
    with running_server(tmp_path_factory.mktemp("token"), f"server.front_ends={request.param}",
                        token=TOKEN) as server:  # fmt: skip
        yield server


def test_right_token_works_and_health_needs_none(
    token_server: ServerProcess, rng: np.random.Generator
) -> None:
    with TridentClient(token_server.target, token=TOKEN) as client:
        reply = client.step(random_rollout(rng))
        assert client.status().global_step == reply.global_step
    with TridentClient(token_server.target) as anonymous:
        assert anonymous.health() == "SERVING"
        assert anonymous.health("trident.v1.TrainerService") == "SERVING"
    assert trident_cli("health", "--server", token_server.target).returncode == 0
    denied = trident_cli("status", "--server", token_server.target)
    assert denied.returncode == 1 and "UNAUTHENTICATED" in denied.stderr
    allowed = trident_cli("status", "--server", token_server.target, "--token", TOKEN)
    assert allowed.returncode == 0, allowed.stderr
    denials = value(
        scrape(token_server), "trident_rpc_errors_total", method="GetStatus", code="UNAUTHENTICATED"
    )
    assert denials >= 1


def test_unauthenticated_error_carries_request_id(token_server: ServerProcess) -> None:
    with grpc.insecure_channel(token_server.target) as channel:
        stub = pb_grpc.TrainerServiceStub(channel)
        request_id = uuid.uuid4().hex
        with pytest.raises(grpc.RpcError) as caught:
            stub.GetStatus(
                pb.GetStatusRequest(), metadata=(("x-request-id", request_id),), timeout=10
            )
        assert caught.value.code() == Code.UNAUTHENTICATED
        assert dict(caught.value.trailing_metadata() or ()).get("x-request-id") == request_id


# ------------------------------------------------------------------------------ binding
def test_port_in_use_is_refused(tmp_path: Path) -> None:
    with running_server(tmp_path / "first") as first:
        try:
            second = running_server(tmp_path / "second", extra_args=("--port", str(first.port)))
        except RuntimeError as error:  # exited before serving: what should happen
            assert str(first.port) in str(error)
        else:
            second.terminate()
            pytest.fail(f"a second server is serving on port {first.port}")
