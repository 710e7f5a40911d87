"""Each record is written once: a Step's reply is the StepResult the server sent, every
StepResponse field read back into the attribute of its name, and GetStatus's answer is the
proto's message itself."""

from __future__ import annotations

import dataclasses

from google.protobuf.descriptor import FieldDescriptor

from service.api.trident.v1 import trainer_pb2 as pb
from service.client.client import step_reply
from service.server.servicer import step_response
from service.types import StepResult


def every_field_set() -> pb.StepResponse:
    """A StepResponse with a value of its own in every field."""
    message = pb.StepResponse()
    for number, field in enumerate(pb.StepResponse.DESCRIPTOR.fields, 1):
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            getattr(message, field.name)[f"k{number}"] = number + 0.5
        elif field.is_repeated:
            getattr(message, field.name).append(f"text {number}")
        elif field.type == FieldDescriptor.TYPE_BOOL:
            setattr(message, field.name, True)
        elif field.type == FieldDescriptor.TYPE_STRING:
            setattr(message, field.name, f"text {number}")
        elif field.type in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
            setattr(message, field.name, number + 0.5)
        else:
            setattr(message, field.name, number)
    return message


def test_a_step_reply_carries_every_field_of_the_step_response_both_ways() -> None:
    message = every_field_set()
    reply = step_reply(message)
    assert isinstance(reply, StepResult)
    assert step_response(reply) == message
    names = {field.name for field in dataclasses.fields(StepResult)}
    assert {field.name for field in pb.StepResponse.DESCRIPTOR.fields} <= names
