"""The seam a front end calls (service/server/learner_api.py) is answered whole by the learner
process's engine and by a front-end process's proxy: every member of the Protocols, with the
same parameters and defaults, so that the servicer works over either."""

from __future__ import annotations

import inspect

import pytest

from service.server import learner as learner_room
from service.server.engine import Engine
from service.server.learner_api import LearnerApi, StreamSeat
from service.server.learner_proxy import LearnerProxy, SeatProxy

SEAMS = [
    (LearnerApi, Engine),
    (StreamSeat, learner_room.StreamSeat),
    (LearnerApi, LearnerProxy),  # a front-end process's, over the handoff
    (StreamSeat, SeatProxy),
]


def members(protocol: type) -> list[str]:
    return [name for name in vars(protocol) if not name.startswith("_")]


def parameters(function: object) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


@pytest.mark.parametrize(("protocol", "implementation"), SEAMS)
def test_the_implementation_answers_every_call_of_the_seam(
    protocol: type, implementation: type
) -> None:
    assert members(protocol), protocol
    for name in members(protocol):
        wanted, given = vars(protocol)[name], getattr(implementation, name, None)
        assert given is not None, f"{implementation.__name__} lacks {name}"
        if isinstance(wanted, property):
            assert isinstance(given, property), f"{implementation.__name__}.{name}: a property"
        else:
            assert parameters(given) == parameters(wanted), f"{implementation.__name__}.{name}"
