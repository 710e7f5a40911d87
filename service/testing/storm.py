"""A storm of abusive Interact clients, as a process of its own (`python -m service.testing.storm
TARGET COUNT [OBS_DIM ENVS]`, `command` builds it): the storm tests' and the benches' one way
to make one. Each client's stream declares ENVS environments (4) of OBS_DIM observations (6:
the tests' small model).

Each client has a channel (a connection) of its own and opens an Interact stream; by `i % 3`:
- "half": sends its InteractStart and half a rollout of env steps, never reads a reply, and
  stays connected, silent (until the server ends it: `server.stream_idle_s`);
- "vanish": the same, then drops its connection without closing the stream;
- "mute": opens the stream and sends nothing at all, never reads.

Once every client has done its part the process prints one JSON line (`{"stormed": COUNT}`)
and holds its connections until its stdin closes (or it is killed), then exits at once without
closing anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys

import grpc
import numpy as np

from service.api.tensors import encode
from service.api.trident.v1 import trainer_pb2 as pb
from service.api.trident.v1 import trainer_pb2_grpc as pb_grpc

KINDS = ("half", "vanish", "mute")
ROLLOUT_LEN = 8  # the rollout each client declares; "half" and "vanish" send half of it
ENVS = 4
OBS_DIM = 6  # the tests' small model (conftest.SMALL)


def requests(rng: np.random.Generator, actor: str, obs_dim: int,
             envs: int) -> list[pb.InteractRequest]:  # fmt: skip
    """A start and half a rollout of one group's env steps (random, well-formed)."""
    def obs() -> pb.Tensor:
        return encode(rng.standard_normal((envs, obs_dim)).astype("<f4"))

    flags = encode(np.zeros(envs, "u1"))
    first = pb.InteractRequest(
        start=pb.InteractStart(actor_id=actor, rollout_len=ROLLOUT_LEN, group_envs=[envs]),
        obs=obs(),
    )
    steps = [
        pb.InteractRequest(obs=obs(), rewards=encode(rng.standard_normal(envs).astype("<f4")),
                           terminated=flags, truncated=flags)
        for _ in range(ROLLOUT_LEN // 2)
    ]
    return [first, *steps]


async def client(target: str, i: int, held: list[grpc.aio.Channel], obs_dim: int,
                 envs: int) -> None:  # fmt: skip
    kind = KINDS[i % len(KINDS)]
    channel = grpc.aio.insecure_channel(target)
    call = pb_grpc.TrainerServiceStub(channel).Interact()
    if kind != "mute":
        rng = np.random.default_rng(i)
        try:
            for request in requests(rng, f"storm-{i}", obs_dim, envs):
                await asyncio.wait_for(call.write(request), 10)
        except (TimeoutError, grpc.RpcError, asyncio.InvalidStateError):
            pass  # refused (server.max_streams) or ended: what the server said is its metrics'
    else:
        with contextlib.suppress(TimeoutError, grpc.RpcError):  # refused: as above
            await asyncio.wait_for(call.wait_for_connection(), 10)
    if kind == "vanish":
        await channel.close(grace=None)
    else:
        held.append(channel)


async def storm(target: str, count: int, obs_dim: int = OBS_DIM, envs: int = ENVS) -> None:
    held: list[grpc.aio.Channel] = []
    results = await asyncio.gather(*(client(target, i, held, obs_dim, envs)
                                     for i in range(count)), return_exceptions=True)  # fmt: skip
    failed = [repr(r) for r in results if isinstance(r, BaseException)]
    print(json.dumps({"stormed": count, "client_errors": failed[:5]}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until stdin closes
    os._exit(0)  # vanish: no stream closed, no GOAWAY



def command(target: str, count: int, *sizes: int) -> list[str]:
    """The command line of a storm process: `count` clients against `target`, and optionally
    OBS_DIM and ENVS."""
    return [sys.executable, "-m", "service.testing.storm", target, str(count), *map(str, sizes)]

if __name__ == "__main__":
    asyncio.run(storm(sys.argv[1], *map(int, sys.argv[2:5])))
