"""Request messages -> validated trainer inputs. Nothing here touches trainer state."""

from __future__ import annotations

import numpy as np

from service.api.tensors import decode
from service.api.trident.v1 import trainer_pb2 as pb
from service.config import Config
from service.errors import InvalidInput, OverLimit
from service.step_ledger import StepKey
from service.trainer.rollout import validate_rollout
from service.types import ActMode, Rollout
from service.unroll import GroupStep, rollout_bytes

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


def observations(request: pb.ActRequest | pb.InteractRequest, config: Config) -> np.ndarray:
    """A request's `obs`: [N, D] float32, N >= 1, finite."""
    if not request.HasField("obs"):
        raise InvalidInput("obs", "a Tensor", "nothing")
    obs = decode(request.obs, "obs", FLOAT)
    D = config.model.obs_dim
    if obs.ndim != 2 or obs.shape[1] != D or obs.shape[0] == 0:
        raise InvalidInput("obs", f"shape [N, {D}] with N >= 1", list(obs.shape))
    _require_finite("obs", obs)
    return obs


def act_inputs(request: pb.ActRequest, config: Config) -> tuple[np.ndarray, ActMode, float]:
    """Decode and check an ActRequest: obs [N, D] float32 finite, a known mode, ε in [0, 1]."""
    obs = observations(request, config)
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


MAX_ROLLOUT_LEN = 4096  # InteractStart.rollout_len


def interact_start(
    request: pb.InteractRequest, config: Config
) -> tuple[str, int, int, list[int], bool]:
    """The (actor_id, first_sequence, rollout_len, group_envs, synchronous) of a stream's
    first request; a rollout larger than `server.max_rollout_mb` is refused before the
    stream allocates anything."""
    if not request.HasField("start"):
        raise InvalidInput("start", "an InteractStart on the stream's first request", "nothing")
    start = request.start
    key = StepKey.checked(start.actor_id, start.first_sequence)
    if not 1 <= start.rollout_len <= MAX_ROLLOUT_LEN:
        raise InvalidInput("start.rollout_len", f"an integer in [1, {MAX_ROLLOUT_LEN}]",
                           start.rollout_len)  # fmt: skip
    groups = list(start.group_envs)
    if not groups or any(n < 1 for n in groups):
        raise InvalidInput("start.group_envs", "one or more positive group sizes", groups)
    N, limit_mb = sum(groups), config.server.max_rollout_mb
    size = rollout_bytes(start.rollout_len, N, config.model.obs_dim, config.model.aux_dim)
    if size > limit_mb * 2**20:
        raise OverLimit(
            f"start: a rollout of {N} environments x {start.rollout_len} steps is "
            f"{size / 2**20:,.1f} MiB; server.max_rollout_mb = {limit_mb} MiB is the largest a "
            "stream may declare (fewer environments per stream, or a shorter rollout_len)"
        )
    return key.actor, key.sequence, start.rollout_len, groups, start.synchronous


def group_step(request: pb.InteractRequest, config: Config) -> GroupStep:
    """Decode and check one InteractRequest's tensors (shapes against the group: Unroller)."""
    if request.HasField("start") and request.group != 0:
        raise InvalidInput("group", "0 on the request that carries start", request.group)
    obs = observations(request, config)
    D = config.model.obs_dim
    if not request.HasField("rewards"):
        for name in ("terminated", "truncated", "final_obs", "bce_labels", "aux_targets"):
            if request.HasField(name):
                raise InvalidInput(name, "nothing on a request without rewards", "a Tensor")
        return GroupStep(obs)
    n = obs.shape[0]
    arrays: dict[str, np.ndarray | None] = {}
    for name, dtypes, shape in (
        ("rewards", FLOAT, (n,)), ("terminated", FLAGS, (n,)), ("truncated", FLAGS, (n,)),
    ):  # fmt: skip
        if not request.HasField(name):
            raise InvalidInput(name, "a Tensor beside rewards", "nothing")
        arrays[name] = _shaped(decode(getattr(request, name), name, dtypes), name, shape)
    _require_finite("rewards", arrays["rewards"])
    terminated = arrays["terminated"].astype(bool)
    truncated = arrays["truncated"].astype(bool)
    if np.any(terminated & truncated):
        raise InvalidInput("truncated", "false where terminated is true", "both set")
    M = int(truncated.sum())
    final_obs = final_index = None
    if M or request.HasField("final_obs"):
        if not (request.HasField("final_obs") and request.HasField("final_obs_index")):
            raise InvalidInput("final_obs", f"final_obs and final_obs_index for the {M} "
                               "truncated environments", "one of them or none")  # fmt: skip
        final_obs = _shaped(decode(request.final_obs, "final_obs", FLOAT), "final_obs", (M, D))
        _require_finite("final_obs", final_obs)
        final_index = _shaped(
            decode(request.final_obs_index, "final_obs_index", INDEX), "final_obs_index", (M,)
        )
        if not np.array_equal(np.sort(final_index), np.flatnonzero(truncated)):
            raise InvalidInput("final_obs_index", "the truncated environments, each once",
                               final_index[:8].tolist())  # fmt: skip
    bce = aux = None
    if request.HasField("bce_labels"):
        bce = _shaped(decode(request.bce_labels, "bce_labels", FLAGS), "bce_labels", (n,))
        bce = bce.astype(np.uint8)
        if np.any(bce > 1):
            raise InvalidInput("bce_labels", "labels in {0, 1}", int(bce.max()))
    if request.HasField("aux_targets"):
        aux = decode(request.aux_targets, "aux_targets", FLOAT)
        K = config.model.aux_dim
        aux = _shaped(aux, "aux_targets", (n, K))
        _require_finite("aux_targets", aux)
    return GroupStep(obs, arrays["rewards"], terminated, truncated, final_obs, final_index,
                     bce, aux)  # fmt: skip


def _shaped(array: np.ndarray, field: str, shape: tuple[int, ...]) -> np.ndarray:
    if array.shape != shape:
        raise InvalidInput(field, f"shape {list(shape)}", list(array.shape))
    return array
