"""Where the device time of Trident's captured update goes, kernel by kernel.

    python bench/gpu_profile.py --sizes 256 4096 --out bench/results/gpu_profile.json

Builds bench/gpu_step.py's `CapturedUpdate` for each B (same config, same data), replays it
--replays times under torch.profiler (CUPTI) and prints, per kernel name, the launches and
the device time per update, largest first. Needs a CUDA device, CuPy and torch.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_step


def profile_update(B: int, replays: int) -> dict:
    import cupy
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from service.trainer.gpu_update import CapturedUpdate

    update = CapturedUpdate(gpu_step.make_config(B, gpu_step.parse_args([])), B, seed=0)
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
    for event in prof.events():
        if event.device_type == DeviceType.CUDA:
            time_us[event.name[:120]] += event.time_range.elapsed_us()
            launches[event.name[:120]] += 1
    rows = [
        {"kernel": name, "launches": launches[name] / replays, "us": us / replays}
        for name, us in time_us.most_common()
    ]
    return {"B": B, "replays": replays, "busy_us": sum(r["us"] for r in rows), "kernels": rows}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096])
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--top", type=int, default=25, help="kernels printed per B")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    report = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ"),
              "results": []}  # fmt: skip
    for B in args.sizes:
        result = profile_update(B, args.replays)
        report["results"].append(result)
        print(f"\nB={B}: device busy {result['busy_us']:.1f} us per update")
        print(f"{'us':>8} {'launches':>8}  kernel")
        for row in result["kernels"][: args.top]:
            print(f"{row['us']:8.1f} {row['launches']:8.1f}  {row['kernel']}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
