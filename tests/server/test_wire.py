"""service.api.wire reads requests as protobuf's own parser does, tensors' bytes without a copy.

Each check draws fresh random messages, serializes them with protobuf and compares what
`wire.parse` reads with what `FromString` reads, field by field: presence, scalars, nested
messages, each Tensor's shape, dtype and bytes. Protobuf is the reference throughout.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from google.protobuf.message import DecodeError, Message

from service.api import wire
from service.api.tensors import DTYPES
from service.api.trident.v1 import trainer_pb2 as pb
from service.errors import InvalidInput
from service.server.servicer import SERVICE, Undecodable, decoded, method_handlers

REQUESTS = (pb.StepRequest, pb.ActRequest, pb.InteractRequest, pb.StreamStepRequest)


def random_tensor(rng: np.random.Generator) -> pb.Tensor:
    """A Tensor of a random dtype code (known or not), rank and bytes (not always consistent:
    the parser does not judge, validation does)."""
    shape = rng.integers(-3, 40, rng.integers(0, 4)).tolist()
    code = int(rng.choice([*DTYPES, -1, 99]))
    return pb.Tensor(shape=shape, dtype=code, data=rng.bytes(int(rng.integers(0, 5000))))


def random_message(cls: type[Message], rng: np.random.Generator) -> Message:
    """A `cls` with each field set or not at random, scalars across their ranges."""
    message = cls()
    for field in cls.DESCRIPTOR.fields:
        if rng.random() < 0.3:
            continue
        if field.message_type is pb.Tensor.DESCRIPTOR:
            getattr(message, field.name).CopyFrom(random_tensor(rng))
        elif field.message_type is pb.StepRequest.DESCRIPTOR:
            getattr(message, field.name).CopyFrom(random_message(pb.StepRequest, rng))
        elif field.message_type is pb.StepKey.DESCRIPTOR:
            sequence = int(rng.integers(-5, 2**40))
            key = pb.StepKey(actor_id=f"actor-{rng.integers(1e6)}", sequence=sequence)
            getattr(message, field.name).CopyFrom(key)
        elif field.message_type is pb.InteractStart.DESCRIPTOR:
            start = pb.InteractStart(
                actor_id="é-actor", first_sequence=int(rng.integers(-(2**62), 2**62)),
                rollout_len=int(rng.integers(-(2**31), 2**31)),
                group_envs=rng.integers(-9, 2**20, rng.integers(0, 4)).tolist(),
                synchronous=bool(rng.integers(2)),
            )  # fmt: skip
            getattr(message, field.name).CopyFrom(start)
        elif field.type == field.TYPE_FLOAT:
            setattr(message, field.name, float(rng.choice([rng.random(), np.nan, -np.inf])))
        elif field.type == field.TYPE_INT64:
            setattr(message, field.name, int(rng.integers(-(2**63), 2**63 - 1)))
        else:  # int32, enum
            setattr(message, field.name, int(rng.integers(-(2**31), 2**31 - 1)))
    return message


def assert_reads_alike(got: Any, want: Message) -> None:
    """Every field of `want` (protobuf's parse) reads the same from `got` (wire's)."""
    for field in want.DESCRIPTOR.fields:
        name = field.name
        if field.has_presence:
            assert got.HasField(name) == want.HasField(name), name
        value, expected = getattr(got, name), getattr(want, name)
        if field.message_type is pb.Tensor.DESCRIPTOR:
            assert list(value.shape) == list(expected.shape), name
            assert value.dtype == expected.dtype, name
            assert bytes(value.data) == expected.data, name
        elif field.message_type is pb.StepRequest.DESCRIPTOR:
            assert_reads_alike(value, expected)
        elif field.type == field.TYPE_FLOAT:
            np.testing.assert_array_equal(np.float32(value), np.float32(expected), name)
        else:
            assert value == expected, name


@pytest.mark.parametrize("cls", REQUESTS, ids=lambda c: c.__name__)
def test_random_requests_read_as_protobuf_reads_them(
    cls: type[Message], rng: np.random.Generator
) -> None:
    for _ in range(60):
        data = random_message(cls, rng).SerializeToString()
        assert_reads_alike(wire.parse(cls.DESCRIPTOR, data), cls.FromString(data))


@pytest.mark.parametrize("cls", REQUESTS, ids=lambda c: c.__name__)
def test_a_field_sent_twice_merges_as_protobuf_merges(
    cls: type[Message], rng: np.random.Generator
) -> None:
    """Concatenated messages are one message: scalars the last, Tensors' shapes appended."""
    for _ in range(30):
        data = random_message(cls, rng).SerializeToString()
        data += random_message(cls, rng).SerializeToString()
        assert_reads_alike(wire.parse(cls.DESCRIPTOR, data), cls.FromString(data))


def test_unknown_fields_and_unpacked_shapes_read_as_protobuf_reads_them(
    rng: np.random.Generator,
) -> None:
    obs = rng.standard_normal((3, 4), dtype=np.float32)
    tensor = (
        b"\x08\x03\x08\x04"  # shape 3, 4 as unpacked varints
        + b"\x10\x01"  # dtype FLOAT32
        + b"\x1a" + bytes([obs.nbytes]) + obs.tobytes()
        + b"\xa8\x06\x07"  # field 101, varint: unknown to Tensor
    )  # fmt: skip
    data = (
        b"\x1a" + bytes([len(tensor)]) + tensor  # InteractRequest.obs (field 3)
        + b"\xfa\x06\x02hi"  # field 111, length-delimited: unknown
        + b"\x10\x05"  # group = 5
        + b"\x15\x00\x00\x00\x00"  # group as a fixed32: the wrong wire type, kept as unknown
    )  # fmt: skip
    got = wire.parse(pb.InteractRequest.DESCRIPTOR, data)
    assert_reads_alike(got, pb.InteractRequest.FromString(data))
    np.testing.assert_array_equal(np.frombuffer(got.obs.data, np.float32).reshape(3, 4), obs)


def test_tensor_bytes_are_a_view_of_the_received_bytes(rng: np.random.Generator) -> None:
    obs = rng.standard_normal((64, 5), dtype=np.float32)
    request = pb.InteractRequest(group=1, obs=pb.Tensor(shape=[64, 5], dtype=pb.D_TYPE_FLOAT32,
                                                        data=obs.tobytes()))  # fmt: skip
    data = request.SerializeToString()
    got = wire.parse(pb.InteractRequest.DESCRIPTOR, data)
    array = np.frombuffer(got.obs.data, np.float32)
    assert np.shares_memory(array, np.frombuffer(data, np.uint8))
    assert not array.flags.writeable
    np.testing.assert_array_equal(array.reshape(64, 5), obs)


@pytest.mark.parametrize("cls", REQUESTS, ids=lambda c: c.__name__)
def test_malformed_bytes_are_refused_as_protobuf_refuses_them(
    cls: type[Message], rng: np.random.Generator
) -> None:
    """Cut short inside a field, or a length past the end: both parsers raise DecodeError."""
    refused = 0
    for _ in range(40):
        data = random_message(cls, rng).SerializeToString()
        if len(data) < 2:
            continue
        cut = data[: int(rng.integers(1, len(data)))]
        try:
            cls.FromString(cut)
        except DecodeError:
            refused += 1
            with pytest.raises(DecodeError):
                wire.parse(cls.DESCRIPTOR, cut)
        else:
            assert_reads_alike(wire.parse(cls.DESCRIPTOR, cut), cls.FromString(cut))
    assert refused > 0
    with pytest.raises(DecodeError):
        wire.parse(cls.DESCRIPTOR, b"\x1a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01")


def test_the_servicer_reads_tensor_requests_in_place_and_the_others_by_protobuf() -> None:
    class Servicer:
        def __getattr__(self, name: str) -> Any:
            return lambda *args: None

    handlers = method_handlers(Servicer())  # type: ignore[arg-type]
    assert set(handlers) == {method.name for method in SERVICE.methods}
    for name, cls in (("Step", pb.StepRequest), ("StreamStep", pb.StreamStepRequest),
                      ("Act", pb.ActRequest), ("Interact", pb.InteractRequest)):  # fmt: skip
        parsed = handlers[name].request_deserializer(cls().SerializeToString())
        assert isinstance(parsed, wire.WireMessage) and parsed.DESCRIPTOR is cls.DESCRIPTOR
    status = handlers["GetStatus"].request_deserializer(b"")
    assert isinstance(status, pb.GetStatusRequest)
    assert handlers["Interact"].request_streaming and handlers["Interact"].response_streaming
    assert not handlers["Act"].request_streaming and not handlers["Act"].response_streaming


def test_the_servicer_hands_undecodable_bytes_to_the_method_not_to_grpc() -> None:
    """Bytes that do not parse reach the method as an Undecodable, which `decoded` refuses as
    INVALID_ARGUMENT; gRPC's own answer to a raising deserializer is INTERNAL."""

    class Servicer:
        def __getattr__(self, name: str) -> Any:
            return lambda *args: None

    handlers = method_handlers(Servicer())  # type: ignore[arg-type]
    for method in SERVICE.methods:
        got = handlers[method.name].request_deserializer(b"\x0a\x05ab")  # runs past the end
        assert isinstance(got, Undecodable), method.name
        assert got.type_name == method.input_type.full_name
        with pytest.raises(InvalidInput, match="do not parse"):
            decoded(got)
