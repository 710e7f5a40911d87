"""The trainer's state: one store of every array the Step and Act read, and its save and load.

Parameters, target network, AdamW moments and step counts, replay, the value head's return
statistics, the settings vector, the Philox key and the host counters live here and nowhere
else; the Learner and the Policy read and write them through this object. Device work here
runs on the caller's current lane: the Trainer calls these methods inside its executor's scope.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import numpy as np

from service.backend import Backend
from service.backend.philox import seed_key
from service.config import Config, ConfigError, with_overrides
from service.config_sizes import left_to_backend
from service.errors import InvalidInput
from service.trainer import model
from service.trainer.hyper import HOT_KEYS, Hyperparams
from service.trainer.replay import ReplayBuffer
from service.trainer.sharding import Sharding
from service.trainer.value_norm import ValueNorm

COUNTERS = ("global_step", "updates_attempted", "act_calls")
VALUE_NORM = "v/norm"  # the value head's return statistics, saved with the parameters


class State:
    """Every array that defines a trainer, on its backend, and the config they follow."""

    def __init__(self, config: Config, backend: Backend, sharding: Sharding | None = None) -> None:
        if config.kickstart.coef and config.kickstart.feature < 0:
            raise ConfigError(f"kickstart.feature = {config.kickstart.feature!r}: expected the "
                              "observation column the teacher reads (>= 0) where "
                              f"kickstart.coef = {config.kickstart.coef!r} > 0; -1 is LobSim's "
                              "inventory column, which only the LobSim job fills in")  # fmt: skip
        self.config = config
        self.backend = backend
        self.sharding = sharding or Sharding.of(config.train.data_shards)
        xp = self.xp = backend.xp
        self.dtype = np.dtype(config.model.dtype)
        self.key = seed_key(config.train.seed)
        self.params = {k: xp.asarray(v) for k, v in model.init_params(config).items()}
        # The target network: a copy of the encoder and the Q head.
        target = ("encoder", "q")
        self.target = {k: v.copy() for k, v in self.params.items() if model.group_of(k) in target}
        self.exp_avg = {k: xp.zeros_like(v) for k, v in self.params.items()}
        self.exp_avg_sq = {k: xp.zeros_like(v) for k, v in self.params.items()}
        self.optim_steps = {g: xp.zeros(1, dtype=np.int64) for g in model.groups(config)}
        # Host counters: they pick the Philox sequence of each draw and the policy version.
        self.counters = {name: np.zeros(1, dtype=np.int64) for name in COUNTERS}
        held, shards = len(self.sharding.owned), self.sharding.shards
        self.replay = ReplayBuffer(
            config.replay.capacity // shards * held, config.model.obs_dim, self.dtype, xp, held
        )
        self.support = backend.ops.c51_support(
            config.c51.v_min, config.c51.v_max, config.c51.num_atoms, self.dtype
        )
        self.hp = Hyperparams(config, backend.scalars)
        ppo = config.ppo
        self.value_norm = ValueNorm(xp, self.dtype, ppo.value_norm_decay, ppo.value_norm)
        # What the device reads of the host's Philox state: the key, and the sequence of the
        # next update / Act call (filled from the counters before each launch; the update
        # advances its own between the updates of one Step).
        self.key_on_device = xp.asarray(np.array(self.key, dtype=np.uint32))
        self.sequences = {name: xp.zeros(1, dtype=np.int64) for name in COUNTERS[1:]}
        self.always = xp.ones(1, dtype=np.uint8)  # the flag of a counter that always advances
        self.no_guard = xp.zeros(1, dtype=self.dtype)  # a host-checked rollout's guard

    @property
    def global_step(self) -> int:
        """Applied Steps so far; also the policy version Act reports."""
        return int(self.counters["global_step"][0])

    def update_hyperparams(self, updates: Mapping[str, float]) -> None:
        """Change hot settings (HOT_KEYS) between Steps; all or nothing."""
        for key in updates:
            if key not in HOT_KEYS:
                raise InvalidInput("hyperparams", f"keys among {list(HOT_KEYS)}", repr(key))
        try:
            config = with_overrides(self.config, [f"{k}={v!r}" for k, v in updates.items()])
        except ConfigError as error:
            raise InvalidInput("hyperparams", "values the config allows", str(error)) from None
        unset = left_to_backend(config)  # 0 means "the backend's", settled at construction
        if unset:
            raise InvalidInput("hyperparams", f"{unset[0]} > 0", repr(updates[unset[0]]))
        self.config = config
        self.hp.refresh(self.config)  # in place: a captured call reads the new values

    def state_dict(self) -> dict[str, np.ndarray]:
        """Every array that defines the trainer, by name `group/...` with groups params, target,
        optim, replay, counters and rng (the seed; with the counters it fixes every future draw).
        """
        host = self.backend.to_host
        # The host counters are copied: the act counter moves on the server's acting thread
        # while a checkpoint writes.
        return {
            name: np.array(host(array)) if name.startswith("counters/") else host(array)
            for name, array in self._state_arrays(gather=True).items()
        }

    def _state_arrays(self, gather: bool = False) -> dict[str, np.ndarray]:
        """`state_dict()`'s arrays where they live (on the device for a GPU backend). With
        `gather` on a rank of a data-parallel world, the replay holds every shard's ring (a
        collective: every rank calls it), so any world size can restore it."""
        state: dict[str, np.ndarray] = {}
        state.update({f"params/{k}": v for k, v in self._policy_arrays().items()})
        state.update({f"target/{k}": v for k, v in self.target.items()})
        state.update({f"optim/exp_avg/{k}": v for k, v in self.exp_avg.items()})
        state.update({f"optim/exp_avg_sq/{k}": v for k, v in self.exp_avg_sq.items()})
        state.update({f"optim/step/{k}": v for k, v in self.optim_steps.items()})
        sharding = self.sharding
        replay = (self.replay.gathered_state(sharding.shards, sharding.comm)
                  if gather and sharding.parallel else self.replay.state())  # fmt: skip
        state.update({f"replay/{k}": v for k, v in replay.items()})
        state.update({f"counters/{k}": v for k, v in self.counters.items()})
        state["rng/seed"] = np.array([self.config.train.seed], dtype=np.uint64)
        return state

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Replace the trainer's state with `state`, checked whole before anything changes.
        The replay holds every shard's ring (`state_dict`); a rank keeps its own."""
        host = self.backend.to_host
        mine = {name: host(array) for name, array in self._state_arrays().items()}
        missing = sorted(set(mine) - set(state))
        unknown = sorted(set(state) - set(mine))
        if missing or unknown:
            raise InvalidInput(
                "state",
                "exactly this trainer's tensors",
                f"missing {missing[:5]}, unknown {unknown[:5]}",
            )
        rows = int(np.asarray(state["replay/size"]).reshape(-1)[0])
        for name, current in mine.items():
            incoming = state[name]
            expected = current.shape
            if name.startswith("replay/") and name not in ("replay/position", "replay/size"):
                expected = (rows * self.sharding.shards, *current.shape[1:])
            if incoming.dtype != current.dtype or incoming.shape != expected:
                raise InvalidInput(
                    name,
                    f"{current.dtype}{list(expected)}",
                    f"{incoming.dtype}{list(incoming.shape)}",
                )
        seed = int(state["rng/seed"][0])
        try:
            config = with_overrides(self.config, [f"train.seed={seed}"])
        except ConfigError as error:
            raise InvalidInput("rng/seed", "a valid train.seed", str(error)) from None
        self.config = config
        self.key = seed_key(seed)
        for name, array in self._state_targets().items():
            self._assign(array, state[name])
        self._assign(self.key_on_device, np.array(self.key, dtype=np.uint32))
        self.replay.load_state(
            {k.removeprefix("replay/"): v for k, v in state.items() if k.startswith("replay/")},
            first_ring=self.sharding.owned.start,
        )

    def _policy_arrays(self) -> dict[str, np.ndarray]:
        """What Act reads: the online parameters and the value head's return statistics."""
        return {**self.params, VALUE_NORM: self.value_norm.stats}

    def load_params(self, params: Mapping[str, np.ndarray]) -> None:
        """Replace what Act reads only (an inference-only server's restore): the online
        parameters and the return statistics, the checkpoint's `params` group."""
        policy = self._policy_arrays()
        for name, current in policy.items():
            incoming = params.get(name)
            if (
                incoming is None
                or incoming.dtype != current.dtype
                or incoming.shape != current.shape
            ):
                got = "nothing" if incoming is None else f"{incoming.dtype}{list(incoming.shape)}"
                raise InvalidInput(f"params/{name}", f"{current.dtype}{list(current.shape)}", got)
        unknown = sorted(set(params) - set(policy))
        if unknown:
            raise InvalidInput("params", "exactly this model's tensors", f"unknown {unknown[:5]}")
        for name, array in policy.items():
            self._assign(array, params[name])

    def memory_bytes(self) -> int:
        """Bytes the backend holds for this trainer: parameters, target, moments and replay."""
        arrays = [
            *self.params.values(),
            *self.target.values(),
            *self.exp_avg.values(),
            *self.exp_avg_sq.values(),
            *self.replay.storage.values(),
        ]
        return sum(array.nbytes for array in arrays)

    def _assign(self, target: np.ndarray, source: np.ndarray) -> None:
        """Overwrite `target` (host counter or backend array) with the host array `source`."""
        target[...] = source if isinstance(target, np.ndarray) else self.xp.asarray(source)

    def _state_targets(self) -> dict[str, np.ndarray]:
        """The fixed-shape state arrays (all but the replay rows), to be overwritten in place."""
        arrays = self._state_arrays().items()
        return {k: v for k, v in arrays if not k.startswith(("replay/", "rng/"))}

    def param_digest(self) -> str:
        """sha256 over every parameter, target and optimizer tensor, in name order.

        Each tensor contributes its name, dtype, shape and little-endian bytes.
        """
        digest, host = hashlib.sha256(), self.backend.to_host
        for name, stored in sorted(self._state_arrays().items()):  # no replay: no gathering
            if name.split("/", 1)[0] not in ("params", "target", "optim"):
                continue
            array = host(stored)
            digest.update(f"{name}|{array.dtype.str}|{array.shape}|".encode())
            digest.update(np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).data)
        return digest.hexdigest()
