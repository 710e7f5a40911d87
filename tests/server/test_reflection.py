"""Server reflection answers under grpc.reflection.v1 (what grpcurl and current clients ask
first) as well as v1alpha: the services listed, and each service's file, v1's own included."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from conftest import running_server
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from service.testing.serverproc import ServerProcess

V1 = "grpc.reflection.v1.ServerReflection"
V1ALPHA = "grpc.reflection.v1alpha.ServerReflection"
SERVICES = {"trident.v1.TrainerService", "grpc.health.v1.Health", V1, V1ALPHA}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with running_server(tmp_path_factory.mktemp("reflection")) as running:
        yield running


def ask(channel: grpc.Channel, service: str, classes: tuple[type, type], **request: str) -> object:
    """One ServerReflectionInfo exchange with `service`, in the given message classes."""
    request_class, response_class = classes
    call = channel.stream_stream(
        f"/{service}/ServerReflectionInfo",
        request_serializer=request_class.SerializeToString,
        response_deserializer=response_class.FromString,
    )
    (reply,) = list(call(iter([request_class(**request)]), timeout=10))
    return reply


def file_of(reply: object) -> descriptor_pb2.FileDescriptorProto:
    (raw,) = reply.file_descriptor_response.file_descriptor_proto  # type: ignore[attr-defined]
    return descriptor_pb2.FileDescriptorProto.FromString(raw)


def v1_classes(channel: grpc.Channel) -> tuple[type, type]:
    """The v1 request and response classes, built from the file the server describes v1 with
    (asked in v1alpha's messages, which the server answers on every path)."""
    alpha = (reflection_pb2.ServerReflectionRequest, reflection_pb2.ServerReflectionResponse)
    proto = file_of(ask(channel, V1ALPHA, alpha, file_containing_symbol=V1))
    assert proto.package == "grpc.reflection.v1"
    assert [m.name for m in proto.service[0].method] == ["ServerReflectionInfo"]
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return (
        message_factory.GetMessageClass(pool.FindMessageTypeByName(
            "grpc.reflection.v1.ServerReflectionRequest")),
        message_factory.GetMessageClass(pool.FindMessageTypeByName(
            "grpc.reflection.v1.ServerReflectionResponse")),
    )  # fmt: skip


def test_reflection_v1_lists_the_services_and_describes_them(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.target) as channel:
        classes = v1_classes(channel)
        reply = ask(channel, V1, classes, list_services="")
        listed = {s.name for s in reply.list_services_response.service}  # type: ignore[attr-defined]
        assert listed == SERVICES
        trainer = file_of(ask(channel, V1, classes,
                              file_containing_symbol="trident.v1.TrainerService"))  # fmt: skip
        # the name a client compiles from protos/ (and imports), not the stubs' package path
        assert trainer.name == "trident/v1/trainer.proto"
        assert "Interact" in {m.name for m in trainer.service[0].method}
        by_name = file_of(ask(channel, V1, classes, file_by_filename=trainer.name))
        assert by_name == trainer
        v1 = file_of(ask(channel, V1, classes, file_containing_symbol=V1))
        assert v1.name == "grpc/reflection/v1/reflection.proto"


def test_reflection_v1alpha_still_answers(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.target) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        (reply,) = list(stub.ServerReflectionInfo(iter([request]), timeout=10))
        assert {s.name for s in reply.list_services_response.service} == SERVICES
