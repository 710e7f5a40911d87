"""Server reflection under both names clients ask for: `grpc.reflection.v1` (grpcurl, Postman,
current grpc clients) and `grpc.reflection.v1alpha` (older ones).

grpcio-reflection ships only the v1alpha service. The v1 protocol is the same one renamed: its
messages have the same fields under the same numbers, so they are the same bytes on the wire.
The v1 service is therefore v1alpha's servicer registered under v1's method path, and its .proto
file is v1alpha's with the package renamed, added to the descriptor pool so that reflection can
describe the v1 service too.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection, reflection_pb2

V1ALPHA_PACKAGE = "grpc.reflection.v1alpha"
V1_PACKAGE = "grpc.reflection.v1"
V1_FILE = "grpc/reflection/v1/reflection.proto"
V1_SERVICE_NAME = f"{V1_PACKAGE}.ServerReflection"
V1ALPHA_SERVICE_NAME = reflection.SERVICE_NAME
METHOD = "ServerReflectionInfo"


def _add_v1_file(pool: descriptor_pool.DescriptorPool) -> None:
    """v1alpha's reflection.proto as v1's, in `pool` (once)."""
    try:
        pool.FindFileByName(V1_FILE)
        return
    except KeyError:
        pass
    proto = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(proto)
    proto.name, proto.package = V1_FILE, V1_PACKAGE
    old, new = f".{V1ALPHA_PACKAGE}.", f".{V1_PACKAGE}."
    for message in proto.message_type:
        for field in message.field:
            if field.type_name.startswith(old):
                field.type_name = new + field.type_name[len(old) :]
    for service in proto.service:
        for method in service.method:
            method.input_type = new + method.input_type[len(old) :]
            method.output_type = new + method.output_type[len(old) :]
    pool.Add(proto)


def enable_reflection(service_names: Sequence[str], server: grpc.Server) -> None:
    """Reflection v1 and v1alpha on `server`, listing `service_names` and both of their own."""
    pool = descriptor_pool.Default()
    _add_v1_file(pool)
    servicer = reflection.ReflectionServicer(
        (*service_names, V1_SERVICE_NAME, V1ALPHA_SERVICE_NAME), pool=pool
    )
    for name in (V1_SERVICE_NAME, V1ALPHA_SERVICE_NAME):
        handler = grpc.stream_stream_rpc_method_handler(
            servicer.ServerReflectionInfo,
            request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
            response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
        )
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(name, {METHOD: handler}),)
        )
