"""A synthetic contextual bandit: a task whose best policy is known, for `trident train --env
bandit` (service/jobs/bandit.py) and the learning test.

Each observation is one of A class prototypes plus Gaussian noise; the rewarded action is a
fixed (seeded) permutation of the class. Every step ends its episode (terminated), so the
value of a context is the chance of picking right and both the policy and the C51 head can
be read off directly: greedy accuracy should approach 1.
"""

from __future__ import annotations

import numpy as np

from service.vector_env import EnvStep


class ContextualBandit:
    """N independent one-step episodes; reward 1 for the context's correct action, else 0."""

    def __init__(
        self, num_envs: int, obs_dim: int, num_actions: int, seed: int, noise: float = 1.5
    ) -> None:
        task_rng = np.random.default_rng([seed, 0])
        self.prototypes = task_rng.standard_normal((num_actions, obs_dim)).astype(np.float32)
        self.answer = task_rng.permutation(num_actions)
        self.noise = noise
        self.num_envs = num_envs
        self.rng = np.random.default_rng([seed, 1])
        self.classes, self.obs = self._draw(num_envs)

    def _draw(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        classes = self.rng.integers(0, self.prototypes.shape[0], count)
        noise = self.rng.standard_normal((count, self.prototypes.shape[1])).astype(np.float32)
        return classes, self.prototypes[classes] + self.noise * noise

    def correct_actions(self, classes: np.ndarray) -> np.ndarray:
        return self.answer[classes]

    def step(self, actions: np.ndarray) -> EnvStep:
        rewards = (actions == self.correct_actions(self.classes)).astype(np.float32)
        self.classes, self.obs = self._draw(self.num_envs)
        done = np.ones(self.num_envs, dtype=bool)
        return EnvStep(
            obs=self.obs,
            rewards=rewards,
            terminated=done,
            truncated=np.zeros(self.num_envs, dtype=bool),
            final_obs=np.zeros((0, self.obs.shape[1]), dtype=np.float32),
        )

    def evaluation_set(self, count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """Fresh contexts and their correct actions, from a generator of their own."""
        rng = np.random.default_rng([seed, 2])
        classes = rng.integers(0, self.prototypes.shape[0], count)
        noise = rng.standard_normal((count, self.prototypes.shape[1])).astype(np.float32)
        return self.prototypes[classes] + self.noise * noise, self.correct_actions(classes)
