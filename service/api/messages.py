"""Protobuf messages as plain Python values, ready for `json.dumps`: numbers stay numbers.

protobuf's own JSON mapping (`MessageToDict`) writes 64-bit integers as strings, so a step or
a byte count would print as "42"; `to_plain` keeps the Python value of every field instead.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message


def to_plain(message: Message) -> dict[str, Any]:
    """Every field of `message` by its proto name: integers as int, enums by name, nested
    messages as dicts, maps as dicts, repeated fields as lists, an unset field that tracks
    presence (`optional`, a message) as None."""
    return {field.name: _field(message, field) for field in message.DESCRIPTOR.fields}


def _field(message: Message, field: FieldDescriptor) -> Any:
    value = getattr(message, field.name)
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        item_field = field.message_type.fields_by_name["value"]
        return {key: _single(item_field, item) for key, item in value.items()}
    if field.is_repeated:
        return [_single(field, item) for item in value]
    if field.has_presence and not message.HasField(field.name):
        return None
    return _single(field, value)


def _single(field: FieldDescriptor, value: Any) -> Any:
    if field.message_type is not None:
        return to_plain(value)
    if field.enum_type is not None:
        return field.enum_type.values_by_number[value].name
    return value
