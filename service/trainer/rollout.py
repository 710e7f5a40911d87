"""A Step's input: a time-major rollout [T, N], its validation, and its n-step transitions."""

from __future__ import annotations

from types import ModuleType

import numpy as np

from service.config import Config
from service.errors import InvalidInput
from service.types import DeviceRollout, Rollout, Transitions


def _shape(name: str, array: object, expected: tuple[int, ...], labels: str) -> np.ndarray:
    if not isinstance(array, np.ndarray):
        raise InvalidInput(name, f"a numpy array of shape {labels}", type(array).__name__)
    if array.shape != expected:
        raise InvalidInput(name, f"shape {labels} = {list(expected)}", list(array.shape))
    return array


def _kind(name: str, array: np.ndarray, kinds: str, what: str) -> None:
    if array.dtype.kind not in kinds:
        raise InvalidInput(name, what, f"dtype {array.dtype}")


def _flags(name: str, array: np.ndarray) -> None:
    _kind(name, array, "bui", "bool or 0/1 integers")
    if array.dtype.kind != "b" and np.any((array != 0) & (array != 1)):
        raise InvalidInput(name, "values in {0, 1}", f"values {np.unique(array)[:5].tolist()}")


def validate_rollout(rollout: Rollout, config: Config) -> None:
    """Raise InvalidInput naming the first field whose shape, dtype or range is wrong.

    Non-finite numbers are not rejected here: the trainer's guard skips such a Step whole.
    """
    actions = rollout.actions
    if not isinstance(actions, np.ndarray) or actions.ndim != 2 or 0 in actions.shape:
        got = list(actions.shape) if isinstance(actions, np.ndarray) else type(actions).__name__
        raise InvalidInput("actions", "a non-empty array of shape [T, N]", got)
    T, N = actions.shape
    D, K, A = config.model.obs_dim, config.model.aux_dim, config.model.num_actions
    _kind("actions", actions, "iu", "an integer dtype")
    if actions.min() < 0 or actions.max() >= A:
        bad = actions[(actions < 0) | (actions >= A)][0]
        raise InvalidInput("actions", f"values in [0, {A})", f"{bad}")
    _kind("obs", _shape("obs", rollout.obs, (T + 1, N, D), "[T+1, N, D]"), "f", "float")
    for name in ("rewards", "behavior_log_probs"):
        _kind(name, _shape(name, getattr(rollout, name), (T, N), "[T, N]"), "f", "float")
    for name in ("terminated", "truncated"):
        _flags(name, _shape(name, getattr(rollout, name), (T, N), "[T, N]"))
    _validate_final_obs(rollout, T, N, D)
    if rollout.bce_labels is not None:
        _flags("bce_labels", _shape("bce_labels", rollout.bce_labels, (T, N), "[T, N]"))
    if rollout.aux_targets is not None:
        if K == 0:
            raise InvalidInput("aux_targets", "no aux targets (model.aux_dim = 0)", "an array")
        aux = _shape("aux_targets", rollout.aux_targets, (T, N, K), "[T, N, K]")
        _kind("aux_targets", aux, "f", "float")


def _validate_final_obs(rollout: Rollout, T: int, N: int, D: int) -> None:
    truncated_index = np.flatnonzero(rollout.truncated.reshape(-1).astype(bool))
    M = truncated_index.size
    if M == 0 and rollout.final_obs is None and rollout.final_obs_index is None:
        return
    if rollout.final_obs is None or rollout.final_obs_index is None:
        raise InvalidInput(
            "final_obs", f"final_obs and final_obs_index for the {M} truncated steps", "one of them"
        )
    _kind("final_obs", _shape("final_obs", rollout.final_obs, (M, D), "[M, D]"), "f", "float")
    index = _shape("final_obs_index", rollout.final_obs_index, (M,), "[M]")
    _kind("final_obs_index", index, "iu", "an integer dtype")
    if not np.array_equal(np.sort(index), truncated_index):
        raise InvalidInput(
            "final_obs_index",
            "the flat indices t*N+n of exactly the truncated steps, each once",
            index[:8].tolist(),
        )


def validate_device_rollout(rollout: DeviceRollout, config: Config) -> None:
    """Raise InvalidInput naming the first field whose shape or dtype is wrong (values unread)."""
    actions = rollout.actions
    if getattr(actions, "ndim", None) != 2 or 0 in actions.shape:
        raise InvalidInput("actions", "a non-empty array of shape [T, N]", _described(actions))
    T, N = actions.shape
    D, K = config.model.obs_dim, config.model.aux_dim
    expected: dict[str, tuple[tuple[int, ...], str, str]] = {
        "actions": ((T, N), "[T, N]", "iu"),
        "obs": ((T + 1, N, D), "[T+1, N, D]", "f"),
        "next_obs": ((T, N, D), "[T, N, D]", "f"),
        "rewards": ((T, N), "[T, N]", "f"),
        "behavior_log_probs": ((T, N), "[T, N]", "f"),
        "terminated": ((T, N), "[T, N]", "b"),
        "truncated": ((T, N), "[T, N]", "b"),
        "bce_labels": ((T, N), "[T, N]", "bui"),
        "aux_targets": ((T, N, K), "[T, N, K]", "f"),
    }
    for name, (shape, labels, kinds) in expected.items():
        array = getattr(rollout, name)
        if array is None and name in ("bce_labels", "aux_targets"):
            continue
        if getattr(array, "shape", None) != shape:
            raise InvalidInput(name, f"shape {labels} = {list(shape)}", _described(array))
        if array.dtype.kind not in kinds:
            raise InvalidInput(name, f"dtype kind in {kinds!r}", f"dtype {array.dtype}")


def _described(array: object) -> object:
    shape = getattr(array, "shape", None)
    return list(shape) if shape is not None else type(array).__name__


def nstep_transitions(
    rollout: Rollout | DeviceRollout,
    next_obs: np.ndarray,
    n: int,
    gamma: float,
    dtype: np.dtype,
    xp: ModuleType,
) -> Transitions:
    """n-step transitions from every step of the rollout, vectorised over [T, N] with `xp`,
    the array module of the rollout's arrays.

    From step t the window sums rewards until the episode ends (termination or truncation),
    n steps pass, or the rollout ends; `horizons` records how many steps it took, so the
    target can bootstrap with γ^k.
    """
    T, N = rollout.horizon, rollout.num_envs
    rewards = rollout.rewards.astype(dtype)
    terminated = rollout.terminated.astype(bool)
    ended = terminated | rollout.truncated.astype(bool)
    t = xp.arange(T)[:, None]
    total = xp.zeros((T, N), dtype=dtype)
    horizon = xp.zeros((T, N), dtype=np.int32)
    done = xp.zeros((T, N), dtype=bool)
    open_window = xp.ones((T, N), dtype=bool)
    for j in range(n):
        row = xp.broadcast_to(xp.minimum(t + j, T - 1), (T, N))
        valid = open_window & (t + j < T)
        total += xp.where(valid, dtype.type(gamma**j) * xp.take_along_axis(rewards, row, 0), 0)
        horizon = xp.where(valid, j + 1, horizon).astype(np.int32)
        done |= valid & xp.take_along_axis(terminated, row, 0)
        open_window = valid & ~xp.take_along_axis(ended, row, 0)
    last = t + horizon - 1  # the step whose successor the target bootstraps from
    envs = xp.arange(N)[None, :]
    D = next_obs.shape[-1]
    return Transitions(
        obs=rollout.obs[:T].astype(dtype).reshape(T * N, D),
        actions=rollout.actions.astype(np.int32).reshape(-1),
        rewards=total.reshape(-1),
        dones=done.astype(np.uint8).reshape(-1),
        horizons=horizon.reshape(-1),
        next_obs=next_obs[last, envs].reshape(T * N, D),
    )
