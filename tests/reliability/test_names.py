"""Checkpoint names are names, never paths: every path-like or blank one is INVALID_ARGUMENT over
gRPC, for Checkpoint and Restore alike, and no file appears outside the checkpoint root."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from conftest import running_server

from service.api.trident.v1 import trainer_pb2 as pb
from service.api.trident.v1 import trainer_pb2_grpc as pb_grpc
from service.testing.serverproc import ServerProcess

BAD_NAMES = [
    "..",
    "../etc",
    "a/../b",
    "/etc/passwd",
    " ..",
    ".. ",
    "./a",
    "a/b",
    "a\\b",
    "~root",
    "a\0b",
    "",
    " ",
    "   ",
    "\t",
    "\n",
    " \t\r\n ",
]


def listing(root: Path) -> set[str]:
    """Every path under `root`, recursively, relative to it."""
    return {
        os.path.relpath(os.path.join(top, name), root)
        for top, dirs, files in os.walk(root)
        for name in [*dirs, *files]
    }


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("names")
    with running_server(tmp, checkpoint_dir=tmp / "area" / "checkpoints") as server:
        yield server


@pytest.mark.parametrize("name", BAD_NAMES, ids=repr)
def test_bad_checkpoint_name_is_invalid_argument(server: ServerProcess, name: str) -> None:
    parent = server.checkpoint_dir.parent
    before = listing(parent)
    with grpc.insecure_channel(server.target) as channel:
        stub = pb_grpc.TrainerServiceStub(channel)
        for method, request in (
            (stub.Checkpoint, pb.CheckpointRequest(name=name)),
            (stub.Restore, pb.RestoreRequest(name=name)),
        ):
            with pytest.raises(grpc.RpcError) as caught:
                method(request, timeout=30)
            error = caught.value
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (name, error.details())
            assert error.details().startswith("name: expected"), error.details()
            assert repr(name) in error.details(), error.details()
    assert listing(parent) == before
    assert not Path("/etc/passwd/x").exists() and not (parent / "b").exists()
