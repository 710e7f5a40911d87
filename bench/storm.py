"""Storm: the server's RSS and its answers to probes through storms of abusive Interact clients.

    python3 bench/storm.py     # 2 storms of 300 clients -> bench/results/storm.json
    python3 bench/storm.py --storms 6 --clients 300 --default-model

A real `trident serve` (NumPy backend; the tests' small model unless `--default-model`, then
obs_dim 6 with the default hidden sizes) at its default limits, but `server.stream_idle_s` set
by `--idle-s` (3) so the storms' silent streams are ended within the run. Each storm is
`tests/storm.py` (clients that half-send and stay silent, that half-send and vanish, that send
nothing; none reads); while it runs, a fresh channel probes health and GetStatus. After each
storm the storm process exits without closing anything, the script waits until
`trident_interact_streams` is 0 and the server's VmRSS has settled (two samples 1 s apart within
1 MiB), and records it. Writes JSON (command, date, RSS before and after each storm, probe
answers, refusals) to --out.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from service.api.trident.v1 import trainer_pb2 as pb
from service.api.trident.v1 import trainer_pb2_grpc as pb_grpc
from service.testing.serverproc import ServerProcess, clean_env, scrape, value
from service.testing.storm import command as storm_command

SMALL = ("train.backend=numpy", "model.obs_dim=6", "model.hidden_dim=16")


def proc_status(server: ServerProcess, key: str) -> int:
    for line in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1])
    raise RuntimeError(f"no {key}")


def rss_mib(server: ServerProcess) -> float:
    return proc_status(server, "VmRSS") / 1024


def settled_rss(server: ServerProcess) -> float:
    last = rss_mib(server)
    for _ in range(30):
        time.sleep(1)
        now = rss_mib(server)
        if abs(now - last) < 1:
            return now
        last = now
    return last


def one_storm(server: ServerProcess, clients: int) -> dict:
    storm = subprocess.Popen(storm_command(server.target, clients),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env=clean_env())  # fmt: skip
    answers = {"health": {}, "status": {}}
    peak = 0.0
    with grpc.insecure_channel(server.target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        trainer = pb_grpc.TrainerServiceStub(channel)
        for _ in range(70):
            for kind, call in (
                ("health", lambda: health.Check(health_pb2.HealthCheckRequest(), timeout=10)),
                ("status", lambda: trainer.GetStatus(pb.GetStatusRequest(), timeout=10)),
            ):
                try:
                    call()
                    code = "OK"
                except grpc.RpcError as error:
                    code = error.code().name
                answers[kind][code] = answers[kind].get(code, 0) + 1
            peak = max(peak, rss_mib(server))
    stormed = json.loads(storm.stdout.readline())
    peak = max(peak, rss_mib(server))
    storm.stdin.close()  # the storm process exits at once, closing nothing
    storm.wait(30)
    deadline = time.monotonic() + 120
    while value(scrape(server), "trident_interact_streams") > 0:
        if time.monotonic() > deadline:
            raise RuntimeError("storm streams still open after 120 s")
        time.sleep(0.2)
    return {"stormed": stormed, "answers": answers, "peak_rss_mib": round(peak, 1),
            "rss_after_mib": round(settled_rss(server), 1),
            "threads_after": proc_status(server, "Threads")}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--storms", type=int, default=2)
    parser.add_argument("--clients", type=int, default=300)
    parser.add_argument("--idle-s", type=float, default=3.0)
    parser.add_argument("--default-model", action="store_true")
    parser.add_argument("--out", default="bench/results/storm.json")
    args = parser.parse_args()
    settings = [SMALL[0], SMALL[1]] if args.default_model else list(SMALL)
    settings.append(f"server.stream_idle_s={args.idle_s}")
    with tempfile.TemporaryDirectory() as tmp, \
            ServerProcess.start(Path(tmp), settings) as server:  # fmt: skip
        time.sleep(1)
        before = settled_rss(server)
        storms = [one_storm(server, args.clients) for _ in range(args.storms)]
        limited = {
            f"{labels}": v for (name, labels), v in scrape(server).items()
            if name == "trident_rpcs_limited_total"
        }  # fmt: skip
    record = {
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%MZ"),
        "settings": settings,
        "rss_before_mib": round(before, 1),
        "storms": storms,
        "rpcs_limited_total": limited,
    }
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
