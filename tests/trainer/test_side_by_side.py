"""Rollout.side_by_side, the learner's Step of several rollouts: each part's columns come back
whole from it (`columns`, its inverse), final observations and their flat indices included;
it is a valid Step of the summed width; its policy version is the oldest part's."""

from __future__ import annotations

import dataclasses

import numpy as np
from conftest import random_rollout, small_config

from service.trainer.rollout import validate_rollout
from service.types import Rollout


def test_each_part_comes_back_whole(rng: np.random.Generator) -> None:
    widths = [int(n) for n in rng.integers(1, 7, int(rng.integers(2, 5)))]
    parts = [random_rollout(rng, T=4, N=n, policy_version=int(rng.integers(10, 20)))
             for n in widths]  # fmt: skip
    merged = Rollout.side_by_side(parts, np.empty)
    validate_rollout(merged, small_config())
    assert merged.num_envs == sum(widths) and merged.horizon == 4
    assert merged.policy_version == min(part.policy_version for part in parts)
    starts = np.cumsum([0, *widths])
    for part, start, stop in zip(parts, starts[:-1], starts[1:], strict=True):
        back = merged.columns(int(start), int(stop))
        for field in dataclasses.fields(Rollout):
            if field.name == "policy_version":
                continue
            np.testing.assert_array_equal(getattr(back, field.name), getattr(part, field.name),
                                          err_msg=field.name)  # fmt: skip
    # where each truncated step's own final observation lands in the merged Step
    T, N = merged.horizon, merged.num_envs
    for part, start in zip(parts, starts, strict=False):
        for row, flat in zip(part.final_obs, part.final_obs_index, strict=True):
            t, n = divmod(int(flat), part.num_envs)
            (at,) = np.flatnonzero(merged.final_obs_index == t * N + start + n)
            np.testing.assert_array_equal(merged.final_obs[at], row)
    index = np.zeros(0, int) if merged.final_obs_index is None else merged.final_obs_index
    assert sorted(index) == np.flatnonzero(merged.truncated.reshape(T * N)).tolist()


def test_parts_without_truncations_or_labels(rng: np.random.Generator) -> None:
    parts = [dataclasses.replace(random_rollout(rng, T=3, N=2, extras=False),
                                 truncated=np.zeros((3, 2), bool), final_obs=None,
                                 final_obs_index=None) for _ in range(3)]  # fmt: skip
    merged = Rollout.side_by_side(parts, np.empty)
    validate_rollout(merged, small_config())
    assert merged.final_obs is None and merged.final_obs_index is None
    assert merged.bce_labels is None and merged.aux_targets is None
    assert merged.policy_version is None
    assert len({part.layout for part in parts}) == 1
    assert merged.layout == parts[0].layout


def test_one_part_is_the_step_itself(rng: np.random.Generator) -> None:
    part = random_rollout(rng)
    assert Rollout.side_by_side([part], np.empty) is part


def test_flags_as_bool_and_as_uint8_join(rng: np.random.Generator) -> None:
    """A stream's flags are bool, a request's may come as uint8 in {0, 1}: the same values."""
    stream, request = random_rollout(rng, T=3, N=2), random_rollout(rng, T=3, N=4)
    as_bytes = {name: getattr(request, name).astype(np.uint8)
                for name in ("terminated", "truncated", "bce_labels")}  # fmt: skip
    merged = Rollout.side_by_side([stream, dataclasses.replace(request, **as_bytes)], np.empty)
    validate_rollout(merged, small_config())
    for name in as_bytes:
        expected = np.concatenate([getattr(stream, name), getattr(request, name)], axis=1)
        np.testing.assert_array_equal(getattr(merged, name), expected, err_msg=name)
