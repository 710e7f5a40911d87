"""A client that goes away mid-stream, and bytes that do not parse, against a real server.

A cancelled Interact or StreamStep (the server waiting on the client's next request) is counted
in trident_rpc_errors_total as CANCELLED and logged at INFO, never as an internal error with a
traceback. Request bytes that do not parse (a field running past the end of the message) on
Act, Step and Interact are INVALID_ARGUMENT with a request id, logged and counted like any bad
input, not gRPC's own INTERNAL "Exception deserializing request!".
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
from conftest import random_rollout, running_server, wait_until

from service.api.tensors import encode
from service.api.trident.v1 import trainer_pb2 as pb
from service.client.client import step_request
from service.testing.serverproc import ServerProcess, scrape, value

SERVICE = "/trident.v1.TrainerService"
OBS_DIM = 6  # conftest.SMALL's model.obs_dim
# Field 1 (length-delimited) says 5 bytes follow, 2 do: the field runs past the message's end.
UNDECODABLE = b"\x0a\x05ab"
WAIT_S = 30.0


@pytest.fixture(scope="module", params=[0, 2], ids=["one-process", "front-ends"])
def server(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[ServerProcess]:
    """In one process, and with the calls in front-end processes (server.front_ends = 2)."""
    with running_server(tmp_path_factory.mktemp("bad-days"),
                        f"server.front_ends={request.param}") as started:  # fmt: skip
        yield started


def errors(server: ServerProcess, method: str, code: str) -> float:
    try:
        return value(scrape(server), "trident_rpc_errors_total", method=method, code=code)
    except KeyError:
        return 0.0


def internal_errors(server: ServerProcess) -> dict[Any, float]:
    return {
        key: count
        for key, count in scrape(server).items()
        if key[0] == "trident_rpc_errors_total" and ("code", "INTERNAL") in key[1] and count
    }


def assert_no_error_logged(server: ServerProcess) -> None:
    loud = [e for e in server.events() if e.get("level") in ("ERROR", "CRITICAL")]
    assert not loud, loud
    assert "Traceback" not in server.stderr()


class Requests:
    """A request stream the test feeds one message at a time."""

    def __init__(self) -> None:
        self._queue: queue.Queue[Any] = queue.Queue()

    def send(self, message: Any) -> None:
        self._queue.put(message)

    def __iter__(self) -> Iterator[Any]:
        while True:
            yield self._queue.get()


def interact_opening(rng: np.random.Generator) -> pb.InteractRequest:
    obs = rng.standard_normal((2, OBS_DIM)).astype("<f4")
    start = pb.InteractStart(actor_id="cancels", rollout_len=4, group_envs=[2])
    return pb.InteractRequest(start=start, obs=encode(obs))


def test_cancelled_streams_count_cancelled_without_a_traceback(server: ServerProcess) -> None:
    rng = np.random.default_rng(33)
    with grpc.insecure_channel(server.target) as channel:
        interact = channel.stream_stream(
            f"{SERVICE}/Interact",
            request_serializer=pb.InteractRequest.SerializeToString,
            response_deserializer=pb.InteractResponse.FromString,
        )
        requests = Requests()
        call = interact(iter(requests))
        requests.send(interact_opening(rng))
        assert next(call).actions.shape == [2]  # acted on: the server now waits for more
        call.cancel()
        wait_until(lambda: errors(server, "Interact", "CANCELLED") == 1, WAIT_S,
                   lambda: f"Interact's CANCELLED not counted:\n{server.stderr()}")  # fmt: skip

        stream_step = channel.stream_stream(
            f"{SERVICE}/StreamStep",
            request_serializer=pb.StreamStepRequest.SerializeToString,
            response_deserializer=pb.StreamStepResponse.FromString,
        )
        requests = Requests()
        call = stream_step(iter(requests))
        rollout = random_rollout(rng, T=4, N=2, D=OBS_DIM)
        requests.send(pb.StreamStepRequest(step=step_request(rollout)))
        assert next(call).step.global_step >= 1  # applied: the server now waits for more
        call.cancel()
        wait_until(lambda: errors(server, "StreamStep", "CANCELLED") == 1, WAIT_S,
                   lambda: f"StreamStep's CANCELLED not counted:\n{server.stderr()}")  # fmt: skip

    assert internal_errors(server) == {}
    cancelled = server.events("cancelled")
    assert {e["method"] for e in cancelled} >= {"Interact", "StreamStep"}
    assert all(e["level"] == "INFO" for e in cancelled)
    assert_no_error_logged(server)


def test_a_stream_past_its_deadline_counts_deadline_exceeded(server: ServerProcess) -> None:
    rng = np.random.default_rng()
    with grpc.insecure_channel(server.target) as channel:
        interact = channel.stream_stream(
            f"{SERVICE}/Interact",
            request_serializer=pb.InteractRequest.SerializeToString,
            response_deserializer=pb.InteractResponse.FromString,
        )
        requests = Requests()
        call = interact(iter(requests), timeout=2.0)
        requests.send(interact_opening(rng))
        assert next(call).actions.shape == [2]  # then nothing more: the deadline passes
        with pytest.raises(grpc.RpcError) as caught:
            next(call)
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        wait_until(lambda: errors(server, "Interact", "DEADLINE_EXCEEDED") == 1, WAIT_S,
                   lambda: f"DEADLINE_EXCEEDED not counted:\n{server.stderr()}")  # fmt: skip
    [ended] = [e for e in server.events("cancelled") if e["code"] == "DEADLINE_EXCEEDED"]
    assert ended["level"] == "INFO" and ended["method"] == "Interact"
    assert internal_errors(server) == {}


def raw_call(channel: grpc.Channel, method: str) -> tuple[grpc.StatusCode, str, dict[str, str]]:
    """UNDECODABLE sent as `method`'s request (a stream of one for Interact); the status."""
    path = f"{SERVICE}/{method}"
    try:
        if method == "Interact":
            call = channel.stream_stream(path)(iter([UNDECODABLE]), timeout=WAIT_S)
            list(call)
        else:
            _, call = channel.unary_unary(path).with_call(UNDECODABLE, timeout=WAIT_S)
    except grpc.RpcError as error:
        trailing = dict(error.trailing_metadata() or ())
        return error.code(), error.details(), trailing
    raise AssertionError(f"{method}: undecodable bytes answered OK")


@pytest.mark.parametrize("method", ["Act", "Step", "Interact"])
def test_undecodable_bytes_are_invalid_argument_with_a_request_id(
    server: ServerProcess, method: str
) -> None:
    before = errors(server, method, "INVALID_ARGUMENT")
    with grpc.insecure_channel(server.target) as channel:
        code, details, trailing = raw_call(channel, method)
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
    assert "do not parse" in details and "trident.v1." in details, details
    request_id = trailing.get("x-request-id")
    assert request_id, trailing
    assert errors(server, method, "INVALID_ARGUMENT") == before + 1
    logged = wait_until(
        lambda: [e for e in server.events("rejected") if e.get("request_id") == request_id],
        WAIT_S,
        lambda: f"no 'rejected' line with request id {request_id}:\n{server.stderr()}",
    )
    assert logged[0]["method"] == method and logged[0]["code"] == "INVALID_ARGUMENT"
    assert internal_errors(server) == {}
    assert_no_error_logged(server)
