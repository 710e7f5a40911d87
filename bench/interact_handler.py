"""What one Interact request costs the server's handler thread, without gRPC or a network.

The servicer's Interact handler runs in this process on pre-serialised requests of one group
(--rows observations of LobSim's shape, the outcome of the previous step, T = --rollout-len),
around a real engine with a tiny NumPy trainer, so the Steps are cheap and the time is the
handler's (each rollout a Step of its own: train.num_envs is the stream's width): decoding and
checking the tensors, the Unroller's writes, the Act through the act
batcher, encoding the reply. cProfile splits the handler thread's own time by function (the
waits for the act batcher and the Steps are listed as lock acquires). Prints a table and
writes JSON.

    python3 bench/interact_handler.py                     # 512 rows, 400 requests
    python3 bench/interact_handler.py --rows 4096 --requests 200 --out /tmp/handler.json
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from grpc_step import DirectContext  # the servicer's context, without gRPC
from prometheus_client import CollectorRegistry

from service.api.trident.v1 import trainer_pb2 as pb
from service.client.interact import interact_request
from service.config import load_config
from service.lobsim.env import LABEL_DIM
from service.server.engine import Engine
from service.server.metrics import Metrics
from service.server.servicer import TrainerServicer, method_handlers
from service.testing import host_report
from service.trainer.trainer import Trainer
from service.vector_env import EnvStep

OBS_DIM = 56  # LobSim's observation at the default visible levels
TINY = ("model.hidden_dim=16", "ppo.epochs=1", "ppo.num_minibatches=1", "replay.min_size=64",
        "replay.batch_size=64", "train.max_policy_lag=1000000")  # fmt: skip


def requests(rows: int, count: int, T: int, rng: np.random.Generator) -> list[bytes]:
    """A stream's serialised requests: the opening one, then `count` with an outcome each."""
    obs = rng.standard_normal((rows, OBS_DIM), dtype=np.float32)
    outcome = EnvStep(
        obs=obs,
        rewards=rng.standard_normal(rows, dtype=np.float32),
        terminated=rng.random(rows) < 0.01,
        truncated=np.zeros(rows, bool),
        final_obs=np.zeros((0, OBS_DIM), np.float32),
        bce_labels=rng.integers(0, 2, rows, dtype=np.uint8),
        aux_targets=rng.standard_normal((rows, LABEL_DIM), dtype=np.float32),
    )
    first = interact_request(0, obs, None)
    first.start.CopyFrom(pb.InteractStart(actor_id="bench", rollout_len=T, group_envs=[rows]))
    return [first.SerializeToString()] + [
        interact_request(0, obs, outcome).SerializeToString() for _ in range(count)
    ]


def measure(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as checkpoints:
        config = load_config(env={}, overrides=[
            "train.backend=numpy", f"model.obs_dim={OBS_DIM}", f"model.aux_dim={LABEL_DIM}",
            f"checkpoint.dir={checkpoints}", f"train.num_envs={args.rows}", *TINY])  # fmt: skip
        engine = Engine(Trainer(config), Metrics(CollectorRegistry()))
        servicer = TrainerServicer(engine.metrics)
        servicer.attach(engine)
        wire = requests(args.rows, args.requests, args.rollout_len, np.random.default_rng(0))

        read = method_handlers(servicer)["Interact"].request_deserializer

        def parsed() -> Iterator[pb.InteractRequest]:
            for message in wire:
                yield read(message)

        profile = cProfile.Profile()
        started = time.perf_counter()
        profile.enable()
        stream = servicer.Interact(parsed(), DirectContext())
        replies = [reply.SerializeToString() for reply in stream]
        profile.disable()
        wall = time.perf_counter() - started
        engine.drain()
        trained = engine.trainer.global_step
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    own = sorted(((tt, f"{Path(name[0]).name}:{name[1]}({name[2]})", calls)
                  for name, (calls, _, tt, _, _) in stats.items()), reverse=True)  # fmt: skip
    waits = sum(tt for tt, name, _ in own if "acquire" in name)
    handler_s = sum(tt for tt, _, _ in own) - waits
    per = lambda seconds: round(1e3 * seconds / len(replies), 4)  # noqa: E731
    return {
        "rows": args.rows,
        "requests": len(replies),
        "steps_trained": trained,
        "wall_s": round(wall, 3),
        "handler_ms_per_request": per(handler_s),
        "waiting_ms_per_request": per(waits),
        "top": [
            {"function": name, "calls": calls, "ms_per_request": per(tt)}
            for tt, name, calls in own[:12]
        ],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=512, help="observations per request")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--rollout-len", type=int, default=32)
    parser.add_argument("--out", type=Path, default=Path("bench/results/interact_handler.json"))
    args = parser.parse_args(argv)
    result = measure(args)
    print(f"{result['requests']} requests of {args.rows} rows "
          f"({result['steps_trained']} Steps trained): "
          f"handler {result['handler_ms_per_request']:.3f} ms a request of its own, "
          f"{result['waiting_ms_per_request']:.3f} ms waiting (Acts, Steps)")  # fmt: skip
    print(f"{'ms / request':>12}  {'calls':>6}  function")
    for row in result["top"]:
        print(f"{row['ms_per_request']:>12.4f}  {row['calls']:>6}  {row['function']}")
    host_report.write_record(args.out, "bench/interact_handler.py",
                             ["numpy", "grpcio", "protobuf", "trident"], result)  # fmt: skip
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
