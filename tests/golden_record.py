"""The trainer's golden record: what the code computes now, to be reproduced byte for byte.

A fixed config and seed, 20 Steps of rollouts drawn from Philox (not from NumPy's Generator,
whose streams may change between NumPy versions), `param_digest` after each Step, then Act in
every mode on fixed observations (actions, and the bytes of log-probs and values). A refactor
that changes what the trainer computes changes this record; `tests/trainer/test_golden.py`
compares it
with `tests/golden/trainer_numpy.json`.

The NumPy record is made under one arithmetic on every x86-64 machine (`PINNED_ARITHMETIC`):
NumPy and OpenBLAS pick their loops by the processor, and their roundings differ (the record
made on an AVX-512 Xeon is not what an AVX2 EPYC computes, for the same code). With NumPy held
to its baseline loops and OpenBLAS to its Prescott kernels, the bytes are the code's alone.
`main` runs itself again under them where they are not set.

    python3 tests/golden_record.py --backend numpy --write tests/golden/trainer_numpy.json
    python3 tests/golden_record.py --backend cuda --write golden_cuda.json   # on a GPU host
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

import numpy as np

from service.backend.philox import Stream, random_bits, uniform01
from service.config import load_config
from service.trainer.trainer import Trainer
from service.types import ActMode, Rollout

STEPS = 20
T, N, D, A, K = 6, 8, 7, 9, 3
SEED = 20261201
CONFIG = (
    "model.obs_dim=7",
    "model.hidden_dim=32",
    "optim.lr=0.002",
    "model.aux_dim=3",
    "replay.capacity=500",
    "replay.min_size=96",
    "replay.batch_size=24",
    "ppo.num_minibatches=3",
    "ppo.epochs=2",
    "c51.target_update_period=7",
    f"train.seed={SEED}",
)


# NumPy's dispatched loops past its x86-64 baseline, and OpenBLAS's SSE3 kernels, which every
# x86-64 processor runs (a feature NumPy does not find on a machine is ignored).
PINNED_ARITHMETIC = {
    "NPY_DISABLE_CPU_FEATURES": "X86_V3 X86_V4 AVX512_ICL AVX512_SPR",
    "OPENBLAS_CORETYPE": "Prescott",
}


def arithmetic_pinnable() -> bool:
    """Whether this machine can run the NumPy record's pinned arithmetic (x86-64 only)."""
    return platform.machine().lower() in ("x86_64", "amd64")


def pinned(env: dict[str, str]) -> bool:
    return all(env.get(name) == value for name, value in PINNED_ARITHMETIC.items())


def uniforms(sequence: int, n: int) -> np.ndarray:
    """n uniforms in [0, 1) (float64) from Philox: the record's own input stream."""
    return uniform01(random_bits((SEED, 7), Stream.LOB_FLOW, sequence, n)[:, 0], np.float64)


def rollout(k: int) -> Rollout:
    """Step k's rollout, every field a function of k alone."""
    u = [uniforms(100 * k + field, size) for field, size in enumerate(
        ((T + 1) * N * D, T * N, T * N, T * N, T * N, T * N, T * N * K, T * N))]  # fmt: skip
    obs, actions, rewards, ends, kinds, log_probs, aux, labels = u
    truncated = ((ends < 0.12) & (kinds < 0.5)).reshape(T, N)
    terminated = ((ends < 0.12) & (kinds >= 0.5)).reshape(T, N)
    index = np.flatnonzero(truncated.reshape(-1))
    finals = uniforms(100 * k + 50, max(index.size, 1) * D)[: index.size * D]
    return Rollout(
        obs=(4 * obs - 2).reshape(T + 1, N, D).astype(np.float32),
        actions=(actions * A).astype(np.int32).reshape(T, N),
        rewards=(6 * rewards - 3).reshape(T, N).astype(np.float32),
        terminated=terminated,
        truncated=truncated,
        behavior_log_probs=(np.log(1 / A) + 0.5 * (log_probs - 0.5)).reshape(T, N).astype(
            np.float32
        ),
        final_obs=(4 * finals - 2).reshape(index.size, D).astype(np.float32),
        final_obs_index=index,
        bce_labels=(labels < 0.5).reshape(T, N).astype(np.uint8),
        aux_targets=(2 * aux - 1).reshape(T, N, K).astype(np.float32),
    )


def record(backend: str) -> dict:
    """The digests of 20 Steps and Act's outputs in every mode, as JSON-ready values."""
    trainer = Trainer(load_config(env={}, overrides=[*CONFIG, f"train.backend={backend}"]))
    digests = []
    for k in range(STEPS):
        result = trainer.step(rollout(k))
        digests.append({"step": k + 1, "digest": trainer.param_digest(),
                        "skipped": result.skipped})  # fmt: skip
    obs = (4 * uniforms(9999, 33 * D) - 2).reshape(33, D).astype(np.float32)
    acts = {}
    for mode in ActMode:
        out = trainer.act(obs, mode, 0.3)
        acts[mode.value] = {
            "actions": out.actions.tolist(),
            "log_probs": out.log_probs.astype("<f4").tobytes().hex(),
            "values": out.values.astype("<f4").tobytes().hex(),
        }
    return {"config": list(CONFIG), "steps": digests, "act": acts}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("numpy", "cuda"), default="numpy")
    parser.add_argument("--write", type=Path, help="write the record here (else print it)")
    args = parser.parse_args(argv)
    if args.backend == "numpy" and not pinned(dict(os.environ)):
        if not arithmetic_pinnable():
            parser.error(f"the NumPy record's arithmetic is x86-64's; this is {platform.machine()}")
        env = {**os.environ, **PINNED_ARITHMETIC}  # read as NumPy and OpenBLAS load: start anew
        given = sys.argv[1:] if argv is None else argv
        os.execve(sys.executable, [sys.executable, __file__, *given], env)
    text = json.dumps(record(args.backend), indent=1) + "\n"
    if args.write:
        args.write.parent.mkdir(parents=True, exist_ok=True)
        args.write.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
