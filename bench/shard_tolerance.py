"""How far apart two float32 trainers of the same math drift: the evidence for
tests/gpu/test_sharding_cuda.py's tolerance.

Each pair trains the GPU tests' model (`GPU_SIZES`) on the same random Steps and reports, after
every Step, the worst relative error ‖a − b‖ / ‖b‖ over the parameter and target tensors (the
tests' measure) and the tensor where it is worst:

- `cuda2_numpy2`: two data shards on CUDA against two on NumPy (the test's pair; GPU only)
- `cuda1_numpy1`: one shard on CUDA against NumPy (test_trainer_cuda's pair; GPU only)
- `numpy2_ulp_up`/`_down`, `numpy1_ulp_up`/`_down`: NumPy against itself with every observation
  moved by one ulp up or down, two shards and one (the noise floor: what a rounding difference
  alone grows to over the same Steps)

    PYTHONPATH=. python3 bench/shard_tolerance.py --seeds 2370016766 --random 20 --out r.json
"""

from __future__ import annotations

import argparse
import json
import secrets
from collections.abc import Callable
from pathlib import Path

import numpy as np

from service.testing.models import GPU_SIZES, SHARDS, nudged, random_rollout, small_config
from service.trainer.trainer import Trainer


def trainer(backend: str, shards: bool) -> Trainer:
    return Trainer(
        small_config(*GPU_SIZES, *(SHARDS if shards else ()), f"train.backend={backend}")
    )


def worst(a: Trainer, b: Trainer) -> tuple[float, str]:
    got, want = a.state_dict(), b.state_dict()
    errors = {}
    for name in want:
        if not name.startswith(("params/", "target/")):
            continue
        w, g = want[name].astype(np.float64), got[name].astype(np.float64)
        scale = np.linalg.norm(w)
        errors[name] = float(np.linalg.norm(g - w) / scale) if scale else float(np.linalg.norm(g))
    name = max(errors, key=errors.__getitem__)
    return errors[name], name


def drift(seed: int, steps: int, make_a: Callable[[], Trainer], make_b: Callable[[], Trainer],
          nudge_a: float = 0.0) -> list[dict]:  # fmt: skip
    a, b = make_a(), make_b()
    rng = np.random.default_rng(seed)
    rows = []
    for step in range(steps):
        rollout = random_rollout(rng)
        a.step(nudged(rollout, nudge_a) if nudge_a else rollout)
        b.step(rollout)
        error, tensor = worst(a, b)
        rows.append({"step": step + 1, "error": error, "tensor": tensor})
    return rows


def pairs(gpu: bool) -> dict[str, Callable[[int], list[dict]]]:
    """name -> the pair's drift at a seed; two shards over the sharding test's 10 Steps, one
    over test_trainer_cuda's 20."""
    found: dict[str, Callable[[int], list[dict]]] = {}
    for shards, steps in ((True, 10), (False, 20)):
        tag = "2" if shards else "1"

        def numpy(shards: bool = shards) -> Trainer:
            return trainer("numpy", shards)

        def cuda(shards: bool = shards) -> Trainer:
            return trainer("cuda", shards)

        for way, towards in (("up", np.inf), ("down", -np.inf)):
            found[f"numpy{tag}_ulp_{way}"] = (
                lambda s, n=steps, t=towards, m=numpy: drift(s, n, m, m, t))  # fmt: skip
        if gpu:
            found[f"cuda{tag}_numpy{tag}"] = lambda s, n=steps, m=numpy, c=cuda: drift(s, n, c, m)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="*", default=[])
    parser.add_argument("--random", type=int, default=10, help="fresh seeds besides --seeds")
    parser.add_argument("--cpu-only", action="store_true")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    seeds = [*args.seeds, *(secrets.randbits(32) for _ in range(args.random))]
    runs = pairs(gpu=not args.cpu_only)
    result: dict[str, dict[str, list[dict]]] = {name: {} for name in runs}
    for seed in seeds:
        for name, run in runs.items():
            rows = run(seed)
            result[name][str(seed)] = rows
            last = rows[-1]
            print(f"{seed:>10} {name:<14} final {last['error']:.2e} ({last['tensor']}) "
                  f"max {max(r['error'] for r in rows):.2e}", flush=True)  # fmt: skip
    summary = {}
    for name, by_seed in result.items():
        finals = np.array([rows[-1]["error"] for rows in by_seed.values()])
        summary[name] = {"median": float(np.median(finals)), "max": float(finals.max()),
                         "p90": float(np.quantile(finals, 0.9))}  # fmt: skip
        row = summary[name]
        print(f"{name:<16} final error over {finals.size} seeds: median {row['median']:.2e} "
              f"p90 {row['p90']:.2e} max {row['max']:.2e}")  # fmt: skip
    args.out.write_text(json.dumps({"seeds": seeds, "summary": summary, "runs": result}, indent=1))


if __name__ == "__main__":
    main()
