"""Where the device time of Trident's captured update goes, kernel by kernel.

    python bench/gpu_profile.py --sizes 256 4096 --out bench/results/gpu_profile.json

Builds bench/gpu_step.py's `CapturedUpdate` for each B (same config, same data), replays it
--replays times under torch.profiler (CUPTI) and prints, per kernel name, the launches and
the device time per update, largest first. Needs a CUDA device, CuPy and torch.

In the graph the side lanes run kernels side by side, so a kernel's time includes what it
shared the GPU with. `--serial` times each kernel alone: the trainer launches them one by one
(`train.cuda_graphs=false`) with CUDA_LAUNCH_BLOCKING=1, so no two overlap; the sum is the
update's serial device time, each row the kernel's own cost.

    CUDA_LAUNCH_BLOCKING=1 python bench/gpu_profile.py --serial --sizes 4096 16384
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from pathlib import Path

import gpu_step


def profile_update(B: int, replays: int, serial: bool = False) -> dict:
    import cupy
    import torch
    from captured_update import CapturedUpdate
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    config = gpu_step.make_config(B, gpu_step.parse_args([]))
    update = CapturedUpdate(config, B, seed=0, graphs=not serial)
    for _ in range(5):
        update.run()
    cupy.cuda.Device().synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            update.run()
        cupy.cuda.Device().synchronize()
    torch.cuda.synchronize()
    time_us: collections.Counter = collections.Counter()
    launches: collections.Counter = collections.Counter()
    device_events = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    for event in device_events:
        time_us[event.name[:120]] += event.time_range.elapsed_us()
        launches[event.name[:120]] += 1
    rows = [
        {"kernel": name, "launches": launches[name] / replays, "us": us / replays}
        for name, us in time_us.most_common()
    ]
    return {
        "B": B,
        "serial": serial,
        "replays": replays,
        "busy_us": sum(r["us"] for r in rows),
        "kernels": rows,
        **timeline(device_events, replays),
    }


def timeline(events: list, replays: int) -> dict:
    """The span of one replay (replays run back to back on one stream, so the k-th block of
    events by start time is the k-th replay), the time no kernel ran in it, and its events."""
    events = sorted(events, key=lambda e: e.time_range.start)
    per_replay = len(events) // replays
    spans, idle = [], []
    for k in range(replays):
        block = events[k * per_replay : (k + 1) * per_replay]
        start = block[0].time_range.start
        spans.append(max(e.time_range.end for e in block) - start)
        covered, reach = 0.0, start
        for e in block:  # union of [start, end) intervals, in start order
            covered += max(0.0, e.time_range.end - max(reach, e.time_range.start))
            reach = max(reach, e.time_range.end)
        idle.append(spans[-1] - covered)
    middle = events[(replays // 2) * per_replay : (replays // 2 + 1) * per_replay]
    origin = middle[0].time_range.start
    return {
        "replay_span_us_median": sorted(spans)[replays // 2],
        "replay_idle_us_median": sorted(idle)[replays // 2],
        "timeline": [
            {
                "start_us": round(e.time_range.start - origin, 2),
                "us": round(e.time_range.elapsed_us(), 2),
                "stream": e.thread,
                "kernel": e.name[:80],
            }
            for e in middle
        ],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096])
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--top", type=int, default=25, help="kernels printed per B")
    parser.add_argument("--serial", action="store_true",
                        help="each kernel alone: eager launches (needs CUDA_LAUNCH_BLOCKING=1)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.serial and os.environ.get("CUDA_LAUNCH_BLOCKING") != "1":
        parser.error("--serial: run with CUDA_LAUNCH_BLOCKING=1 in the environment (the CUDA "
                     "driver reads it when it starts)")  # fmt: skip
    report = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ"),
              "results": []}  # fmt: skip
    for B in args.sizes:
        result = profile_update(B, args.replays, args.serial)
        report["results"].append(result)
        print(
            f"\nB={B}: device busy {result['busy_us']:.1f} us per update; one replay spans "
            f"{result['replay_span_us_median']:.1f} us, {result['replay_idle_us_median']:.1f} "
            "us of it with no kernel running (medians)"
        )
        print(f"{'us':>8} {'launches':>8}  kernel")
        for row in result["kernels"][: args.top]:
            print(f"{row['us']:8.1f} {row['launches']:8.1f}  {row['kernel']}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
