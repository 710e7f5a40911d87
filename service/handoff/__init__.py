"""The handoff between gRPC front-end processes and the one learner process, in shared memory.

Front ends write observations and rollouts in place into slots of shared memory the learner
made for them, and pass only slot indices and a small header over a control channel; the
learner reads the same slots through views of one layout and answers in them. Modules:

    layout.py    the wire layout, stated once: every shared array's dtype, shape and offset
    limits.py    the slots' sizes from the server's settings, and the checks that refuse more
    segment.py   shared memory with no name (memfd), mapped on both sides
    channel.py   the control channel: struct-packed messages over a Unix SEQPACKET socket
    learner.py   the learner's side: `Hub`, which serves every front end's Acts and rollouts
    frontend.py  a front end's side: `Handoff`, which its handler threads call

No gRPC and no trainer here: the learner's calls come in as callables.
"""

from service.handoff.frontend import ActSlot, Handoff, RolloutFuture, RolloutSlot
from service.handoff.layout import Layout, RolloutShape, act_layout
from service.handoff.learner import Delivery, FrontEndInfo, Hub
from service.handoff.limits import HandoffLimits, SlotSizes

__all__ = [
    "ActSlot",
    "Delivery",
    "FrontEndInfo",
    "Handoff",
    "HandoffLimits",
    "Hub",
    "Layout",
    "RolloutFuture",
    "RolloutShape",
    "RolloutSlot",
    "SlotSizes",
    "act_layout",
]
