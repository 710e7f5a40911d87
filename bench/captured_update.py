"""One full update of the CUDA trainer as a replayable graph: bench/gpu_step.py's Trident column.

`CapturedUpdate(config, B)` builds a CUDA trainer, fills its replay to capacity and one B-row
rollout minibatch with random data (the distributions of bench/torch_update.py's
`random_data`), and runs the update exactly as a Step does (`Updates.run` with one minibatch:
a replay draw, every head, backward, clip, AdamW, target refresh, the statistics) twice:
eagerly, then captured. `run()` enqueues one more replay of that graph on CuPy's current stream
(`Executor.replay`); each replay draws a fresh replay sample (the graph advances its Philox
sequence). With `graphs=False` the trainer launches the kernels one by one and `run()` runs
the update again that way (bench/gpu_profile.py --serial). Public API only.
"""

from __future__ import annotations

import cupy
import numpy as np

from service.config import Config, with_overrides
from service.trainer.trainer import Trainer
from service.trainer.update import Batch, batch_arrays, update_key
from service.types import Transitions


def _log_softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - x.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


class CapturedUpdate:
    """A CUDA trainer with one captured B-row update (B rollout rows + B replay rows)."""

    def __init__(self, config: Config, batch_size: int, seed: int = 0, graphs: bool = True) -> None:
        graphs_setting = f"train.cuda_graphs={str(graphs).lower()}"
        config = with_overrides(config, ["train.backend=cuda", graphs_setting])
        self.graphs = graphs
        self.trainer = trainer = Trainer(config)
        model, B = config.model, batch_size
        D, A, K = model.obs_dim, model.num_actions, model.aux_dim
        rng = np.random.default_rng(seed)
        size = config.replay.capacity
        logits = rng.standard_normal((B, A)).astype(np.float32)
        actions = rng.integers(0, A, B).astype(np.int32)
        host = Batch(
            obs=rng.standard_normal((B, D)).astype(np.float32),
            actions=actions,
            behavior_log_probs=_log_softmax(logits)[np.arange(B), actions],
            advantages=rng.standard_normal(B).astype(np.float32),
            returns=rng.standard_normal(B).astype(np.float32),
            old_values=rng.standard_normal(B).astype(np.float32),
            bce_labels=(rng.random(B) < 0.5).astype(np.float32),
            aux_targets=rng.standard_normal((B, K)).astype(np.float32) if K else None,
            guard=np.zeros(1, dtype=np.float32),
        )
        order = cupy.asarray(rng.permutation(B).astype(np.int32))  # a Step's order is on the device
        bounds = [(0, B)]
        with trainer.on_device():
            trainer.state.replay.insert(
                Transitions(
                    obs=rng.standard_normal((size, D)).astype(np.float32),
                    actions=rng.integers(0, A, size).astype(np.int32),
                    rewards=rng.standard_normal(size).astype(np.float32),
                    dones=(rng.random(size) < 0.02).astype(np.uint8),
                    horizons=np.ones(size, dtype=np.int32),
                    next_obs=rng.standard_normal((size, D)).astype(np.float32),
                )
            )
            batch = Batch(*(None if a is None else cupy.asarray(a) for a in batch_arrays(host)))
            for _ in range(2):  # eager (warm-up), then captured and replayed
                # the captured statistics vector: every replay rewrites it
                self.totals = trainer.learner.updates.run(batch, order, bounds, use_q=True)
            trainer.synchronize()
        self._key = update_key(order, bounds, batch, use_q=True)
        self._eager = (batch, order, bounds)

    def run(self) -> None:
        """Enqueue one update on CuPy's current stream; does not synchronise."""
        if self.graphs:
            self.trainer.executor.replay(self._key)
            return
        batch, order, bounds = self._eager
        with self.trainer.on_device():
            self.trainer.learner.updates.run(batch, order, bounds, use_q=True)
