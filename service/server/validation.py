"""Request messages -> validated trainer inputs. Nothing here touches trainer state."""

from __future__ import annotations

import numpy as np

from service.api.tensors import decode
from service.api.trident.v1 import trainer_pb2 as pb
from service.config import Config
from service.errors import InvalidInput
from service.step_ledger import StepKey
from service.trainer.rollout import validate_rollout
from service.types import ActMode, Rollout

FLOAT = (pb.D_TYPE_FLOAT32,)
INDEX = (pb.D_TYPE_INT32, pb.D_TYPE_INT64)
FLAGS = (pb.D_TYPE_UINT8, pb.D_TYPE_BOOL)

# Field: (accepted dtypes, required).
STEP_FIELDS: dict[str, tuple[tuple[int, ...], bool]] = {
    "obs": (FLOAT, True),
    "actions": (INDEX, True),
    "rewards": (FLOAT, True),
    "terminated": (FLAGS, True),
    "truncated": (FLAGS, True),
    "behavior_log_probs": (FLOAT, True),
    "final_obs": (FLOAT, False),
    "final_obs_index": (INDEX, False),
    "bce_labels": (FLAGS, False),
    "aux_targets": (FLOAT, False),
}

ACT_MODES = {
    pb.ACT_MODE_UNSPECIFIED: ActMode.SAMPLE,
    pb.ACT_MODE_SAMPLE: ActMode.SAMPLE,
    pb.ACT_MODE_GREEDY_PI: ActMode.GREEDY_PI,
    pb.ACT_MODE_GREEDY_Q: ActMode.GREEDY_Q,
    pb.ACT_MODE_EPSILON_GREEDY: ActMode.EPSILON_GREEDY,
}


def _require_finite(field: str, array: np.ndarray) -> None:
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        index = int(np.flatnonzero(~np.isfinite(array.reshape(-1)))[0])
        value = array.reshape(-1)[index]
        raise InvalidInput(field, "finite numbers", f"{value} at flat index {index}")


def rollout_from_request(request: pb.StepRequest, config: Config) -> Rollout:
    """Decode and check a StepRequest: dtypes, byte lengths, shapes, ranges, finiteness."""
    arrays: dict[str, np.ndarray | None] = {}
    for field, (dtypes, required) in STEP_FIELDS.items():
        if not request.HasField(field):
            if required:
                raise InvalidInput(field, "a Tensor", "nothing")
            arrays[field] = None
            continue
        array = decode(getattr(request, field), field, dtypes)
        _require_finite(field, array)
        arrays[field] = array
    version = request.policy_version if request.HasField("policy_version") else None
    if version is not None and version < 0:
        raise InvalidInput("policy_version", "a non-negative version", version)
    rollout = Rollout(**arrays, policy_version=version)
    validate_rollout(rollout, config)
    return rollout


def act_inputs(request: pb.ActRequest, config: Config) -> tuple[np.ndarray, ActMode, float]:
    """Decode and check an ActRequest: obs [N, D] float32 finite, a known mode, ε in [0, 1]."""
    if not request.HasField("obs"):
        raise InvalidInput("obs", "a Tensor", "nothing")
    obs = decode(request.obs, "obs", FLOAT)
    D = config.model.obs_dim
    if obs.ndim != 2 or obs.shape[1] != D or obs.shape[0] == 0:
        raise InvalidInput("obs", f"shape [N, {D}] with N >= 1", list(obs.shape))
    _require_finite("obs", obs)
    mode = ACT_MODES.get(request.mode)
    if mode is None:
        names = [pb.ActMode.Name(value) for value in ACT_MODES]
        raise InvalidInput("mode", f"one of {names}", request.mode)
    epsilon = float(request.epsilon)
    if not 0.0 <= epsilon <= 1.0:  # also rejects NaN
        raise InvalidInput("epsilon", "a probability in [0, 1]", epsilon)
    return obs, mode, epsilon


def key_from_request(request: pb.StepRequest) -> StepKey | None:
    """The request's idempotency key, checked; None when it carries none."""
    if not request.HasField("idempotency_key"):
        return None
    key = request.idempotency_key
    return StepKey.checked(key.actor_id, key.sequence)
