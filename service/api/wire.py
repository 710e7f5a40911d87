"""Request messages whose tensors are read in place: each Tensor's bytes are a read-only view of
the bytes gRPC received, not a copy.

protobuf's Python runtime (upb) copies a message's bytes when it parses it, and again every time
a `bytes` field is read. An Interact request's observations were copied three times under the
GIL before NumPy saw them, and under many load generators the parse and the reads of
`Tensor.data` held the GIL for much of the server's time (py-spy `--profile-gil`;
docs/benchmarks/interact_handler.md has the handler's cost). `parse` walks the wire format of a
message that holds Tensors: a Tensor's `data` stays a memoryview of the received bytes, a nested
message that holds Tensors is walked the same way, and every other field is decoded as protobuf
decodes it (message fields by protobuf itself). The result answers what the servicer asks of a
request (attributes, `HasField`) as the generated class does.

Malformed bytes raise `DecodeError`, as protobuf's parser does; the server's handlers
(service/server/servicer.py `method_handlers`) turn that into INVALID_ARGUMENT with a request id.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError
from google.protobuf.message_factory import GetMessageClass

from service.api.trident.v1 import trainer_pb2 as pb

__all__ = ["DecodeError", "WireMessage", "WireTensor", "deserializer", "holds_tensors", "parse"]

TENSOR = pb.Tensor.DESCRIPTOR
VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5
F = FieldDescriptor
WIRE_TYPES = {
    **dict.fromkeys((F.TYPE_INT32, F.TYPE_INT64, F.TYPE_UINT32, F.TYPE_UINT64, F.TYPE_SINT32,
                     F.TYPE_SINT64, F.TYPE_BOOL, F.TYPE_ENUM), VARINT),
    **dict.fromkeys((F.TYPE_FIXED64, F.TYPE_SFIXED64, F.TYPE_DOUBLE), FIXED64),
    **dict.fromkeys((F.TYPE_FIXED32, F.TYPE_SFIXED32, F.TYPE_FLOAT), FIXED32),
    **dict.fromkeys((F.TYPE_STRING, F.TYPE_BYTES, F.TYPE_MESSAGE), LENGTH),
}
FIXED_FORMATS = {
    F.TYPE_FIXED64: "<Q", F.TYPE_SFIXED64: "<q", F.TYPE_DOUBLE: "<d",
    F.TYPE_FIXED32: "<I", F.TYPE_SFIXED32: "<i", F.TYPE_FLOAT: "<f",
}  # fmt: skip


def _signed(value: int, bits: int) -> int:
    """The two's-complement reading of the low `bits` bits of a varint."""
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


VARINT_VALUES: dict[int, Callable[[int], Any]] = {
    F.TYPE_INT32: lambda v: _signed(v, 32),
    F.TYPE_INT64: lambda v: _signed(v, 64),
    F.TYPE_ENUM: lambda v: _signed(v, 32),
    F.TYPE_UINT32: lambda v: v & 0xFFFFFFFF,
    F.TYPE_UINT64: lambda v: v & 0xFFFFFFFFFFFFFFFF,
    F.TYPE_SINT32: lambda v: ((v & 0xFFFFFFFF) >> 1) ^ -(v & 1),
    F.TYPE_SINT64: lambda v: ((v & 0xFFFFFFFFFFFFFFFF) >> 1) ^ -(v & 1),
    F.TYPE_BOOL: bool,
}


class WireTensor:
    """A Tensor message as `pb.Tensor` reads: `shape`, `dtype`, and `data` (a memoryview)."""

    __slots__ = ("data", "dtype", "shape")

    def __init__(self) -> None:
        self.shape: list[int] = []
        self.dtype = 0
        self.data: memoryview | bytes = b""


class WireMessage:
    """A parsed message: a set field's value by attribute, an unset one's default, `HasField`
    for the fields that track presence."""

    def __init__(self, descriptor: Descriptor) -> None:
        self.DESCRIPTOR = descriptor
        self._values: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("_values", {})
        if name in values:
            return values[name]
        field = self.DESCRIPTOR.fields_by_name.get(name) if "DESCRIPTOR" in self.__dict__ else None
        if field is None:
            raise AttributeError(f"a {type(self).__name__} has no field {name!r}")
        if field.is_repeated:
            return self._values.setdefault(name, [])
        if field.message_type is TENSOR:
            return WireTensor()
        if field.message_type is not None:
            return WireMessage(field.message_type) if holds_tensors(field.message_type) \
                else GetMessageClass(field.message_type)()  # fmt: skip
        return field.default_value

    def HasField(self, name: str) -> bool:  # noqa: N802  (protobuf's name)
        field = self.DESCRIPTOR.fields_by_name.get(name)
        if field is None or not field.has_presence:
            raise ValueError(f'{self.DESCRIPTOR.name} has no field "{name}" with presence')
        return name in self._values


@functools.cache
def holds_tensors(descriptor: Descriptor) -> bool:
    """Whether a message of this type holds a Tensor, directly or in a nested message."""
    return _holds(descriptor, frozenset())


def _holds(descriptor: Descriptor, seen: frozenset[str]) -> bool:
    if descriptor is TENSOR:
        return True
    seen = seen | {descriptor.full_name}
    return any(
        field.message_type is not None and field.message_type.full_name not in seen
        and _holds(field.message_type, seen)
        for field in descriptor.fields
    )  # fmt: skip


def deserializer(descriptor: Descriptor) -> Callable[[bytes], WireMessage]:
    """gRPC's request deserializer for messages of this type."""
    return lambda data: parse(descriptor, data)


def parse(descriptor: Descriptor, data: bytes | memoryview) -> WireMessage:
    """The message of type `descriptor` that `data` encodes; DecodeError if it is malformed."""
    message = WireMessage(descriptor)
    _merge(message, memoryview(data).cast("B"))
    return message


def _varint(view: memoryview, pos: int) -> tuple[int, int]:
    """The unsigned varint at `pos` and the position after it."""
    value = shift = 0
    while True:
        if pos >= len(view) or shift > 63:
            raise DecodeError("truncated or overlong varint")
        byte = view[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _fields(view: memoryview) -> Any:
    """(field number, wire type, value) for each field of the encoded message in `view`: a
    varint's value, a fixed field's bytes, a length-delimited field's view."""
    pos, end = 0, len(view)
    while pos < end:
        tag, pos = _varint(view, pos)
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise DecodeError("field number 0")
        if wire == VARINT:
            value, pos = _varint(view, pos)
        elif wire in (FIXED64, FIXED32):
            size = 8 if wire == FIXED64 else 4
            value, pos = view[pos : pos + size], pos + size
        elif wire == LENGTH:
            size, pos = _varint(view, pos)
            value, pos = view[pos : pos + size], pos + size
        else:
            raise DecodeError(f"wire type {wire} (groups are not used by this API)")
        if pos > end:
            raise DecodeError("truncated message")
        yield number, wire, value


def _merge(message: WireMessage, view: memoryview) -> None:
    """Fields of `view` into `message`, as protobuf merges: a scalar's last value wins, a
    message field merges, a repeated field appends."""
    by_number = message.DESCRIPTOR.fields_by_number
    values = message._values
    for number, wire, value in _fields(view):
        field = by_number.get(number)
        if field is None:
            continue  # an unknown field, kept by protobuf, read by nobody here
        expected = WIRE_TYPES[field.type]
        if field.is_repeated and wire == LENGTH and expected != LENGTH:
            values.setdefault(field.name, []).extend(_packed(field, value))
        elif wire != expected:
            continue  # protobuf keeps a field of the wrong wire type as unknown
        elif field.is_repeated:
            values.setdefault(field.name, []).append(_single(field, wire, value, None))
        else:
            values[field.name] = _single(field, wire, value, values.get(field.name))


def _single(field: FieldDescriptor, wire: int, value: Any, previous: Any) -> Any:
    if wire == VARINT:
        return VARINT_VALUES[field.type](value)
    if wire != LENGTH:
        return struct.unpack(FIXED_FORMATS[field.type], value)[0]
    if field.type == F.TYPE_BYTES:
        return bytes(value)
    if field.type == F.TYPE_STRING:
        try:
            return str(value, "utf-8")
        except UnicodeDecodeError:
            raise DecodeError(f"{field.name}: invalid UTF-8") from None
    if field.message_type is TENSOR:
        tensor = previous if previous is not None else WireTensor()
        _merge_tensor(tensor, value)
        return tensor
    if holds_tensors(field.message_type):
        nested = previous if previous is not None else WireMessage(field.message_type)
        _merge(nested, value)
        return nested
    nested = previous if previous is not None else GetMessageClass(field.message_type)()
    nested.MergeFromString(value)
    return nested


def _packed(field: FieldDescriptor, view: memoryview) -> list[Any]:
    if WIRE_TYPES[field.type] != VARINT:
        size = 8 if WIRE_TYPES[field.type] == FIXED64 else 4
        if len(view) % size:
            raise DecodeError(f"{field.name}: packed fixed values of a partial length")
        return list(struct.unpack(f"<{len(view) // size}{FIXED_FORMATS[field.type][1]}", view))
    values, pos, convert = [], 0, VARINT_VALUES[field.type]
    while pos < len(view):
        value, pos = _varint(view, pos)
        values.append(convert(value))
    return values


SHAPE, DTYPE, DATA = (TENSOR.fields_by_name[name].number for name in ("shape", "dtype", "data"))


def _merge_tensor(tensor: WireTensor, view: memoryview) -> None:
    """A Tensor's fields into `tensor`: shape appended, dtype and data replaced; data as a
    view of the received bytes."""
    for number, wire, value in _fields(view):
        if number == SHAPE and wire == LENGTH:
            tensor.shape.extend(_packed(TENSOR.fields_by_number[SHAPE], value))
        elif number == SHAPE and wire == VARINT:
            tensor.shape.append(_signed(value, 64))
        elif number == DTYPE and wire == VARINT:
            tensor.dtype = _signed(value, 32)
        elif number == DATA and wire == LENGTH:
            tensor.data = value.toreadonly()
