"""The control calls a front-end process makes of the learner process over the handoff (CALL and
ANSWER: small JSON), named and encoded once for both sides: `learner_proxy` asks,
`learner_hub` answers. Arrays never travel here; they cross in the handoff's slots.

    config              -> {"config": the learner's settings (Config.public_dict()),
                            "inference_only": bool}
    checkpoint {name}   -> a CheckpointInfo
    restore {name}      -> {"checkpoint": a CheckpointInfo, "digest": str}
    list_checkpoints    -> [CheckpointInfo, ...]
    update_hyperparams {values} -> the settings as JSON (str)
    status              -> GetStatusResponse, serialized and base64-encoded
    drain {grace_s}     -> a CheckpointInfo or None
    ready {pid, index}  -> None: a front end serves gRPC
    metrics {families}  -> None: a front end's own series (server.front_end_metrics)
    admit {bound}       -> bool: a place in the server-wide admission bound taken
    leave {bound}       -> None: a place given back

A CheckpointInfo travels as its fields (the path as a string).
"""

from __future__ import annotations

import base64
import dataclasses
from pathlib import Path
from typing import Any

from service.api.trident.v1 import trainer_pb2 as pb
from service.types import CheckpointInfo

CONFIG = "config"
CHECKPOINT = "checkpoint"
RESTORE = "restore"
LIST_CHECKPOINTS = "list_checkpoints"
UPDATE_HYPERPARAMS = "update_hyperparams"
STATUS = "status"
DRAIN = "drain"
READY = "ready"
METRICS = "metrics"
ADMIT = "admit"
LEAVE = "leave"


def info_to_json(info: CheckpointInfo | None) -> dict[str, Any] | None:
    if info is None:
        return None
    fields = dataclasses.asdict(info)
    fields["path"] = str(info.path)
    return fields


def info_from_json(fields: dict[str, Any] | None) -> CheckpointInfo | None:
    if fields is None:
        return None
    return CheckpointInfo(**{**fields, "path": Path(fields["path"])})


def status_to_json(status: pb.GetStatusResponse) -> str:
    return base64.b64encode(status.SerializeToString()).decode()


def status_from_json(text: str) -> pb.GetStatusResponse:
    return pb.GetStatusResponse.FromString(base64.b64decode(text))
