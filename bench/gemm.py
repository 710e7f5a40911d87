"""The update's GEMMs at one batch size: cuBLAS SGEMM against bench/kernels/gemm_tf32x3.cu.

Each row is one GEMM of the captured update at B (rollout rows + replay rows through the
encoder, the target network on the replay rows), D=40, H=256, A·Z=459: the NN products of the
forward, the NT product of the encoder's backward, with cuBLAS SGEMM beside the tensor-core
kernel at both tile heights and at the height the wrapper picks. The "fused" columns time the
GEMM with its epilogue (bias + ReLU, or the ReLU gate) against what the update runs: cuBLAS
followed by encoder.cu's separate epilogue kernel (bias_relu_fwd, bias_relu_bwd). Each cell is
the device time per launch: `--repeats` launches captured in one CUDA graph, the median of
`--blocks` timed replays. Writes JSON (command, date, device, every cell) and prints a table.

    PYTHONPATH=. python3 bench/gemm.py            # B = 4096 -> bench/results/gemm.json
    PYTHONPATH=. python3 bench/gemm.py --batch 1024 --out /tmp/gemm.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from service.testing import host_report

D, H, AZ = 40, 256, 9 * 51


def shapes(B: int) -> list[dict]:
    """(name, M, K, N, layout, epilogue) of each GEMM the update runs at batch B."""
    rows = 2 * B  # rollout rows stacked on replay rows
    table = [
        ("encoder W0 (x W0)", rows, D, H, False, "bias_relu"),
        ("encoder W1 (h1 W1)", rows, H, H, False, "bias_relu"),
        ("target W0", B, D, H, False, "bias_relu"),
        ("target W1", B, H, H, False, "bias_relu"),
        ("target C51 logits", B, H, AZ, False, ""),
        ("grad z0 (g W1ᵀ)", rows, H, H, True, "relu_gate"),
    ]
    keys = ("name", "M", "K", "N", "nt", "fused")
    return [dict(zip(keys, row, strict=True)) for row in table]


def time_launches(fn: Callable[[], object], repeats: int, blocks: int) -> float:
    """Device time per call of `fn`, µs: `repeats` calls captured in one CUDA graph, the graph
    replayed `blocks` times, each replay timed by CUDA events; the median replay / repeats.
    Inside a graph a launch costs ~1 µs of the host's time instead of ~6-20 µs from Python,
    so small GEMMs are timed on the device, not on the launch path."""
    import cupy

    from service.backend.cuda.capture import CapturedCalls

    stream = cupy.cuda.Stream(non_blocking=True)
    calls = CapturedCalls(stream)
    with stream:
        for _ in range(2):  # eager (compiles, creates handles), then captured and launched
            calls.run("block", lambda: [fn() for _ in range(repeats)])
        stream.synchronize()
        per_call = []
        for _ in range(blocks):
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record(stream)
            calls.launch("block", stream)
            end.record(stream)
            end.synchronize()
            per_call.append(1e3 * cupy.cuda.get_elapsed_time(start, end) / repeats)
    return float(np.median(per_call))


def measure(row: dict, repeats: int, blocks: int, seed: int) -> dict:
    import cupy
    from tensor_core_gemm import tensor_core_gemm

    from service.backend.cuda.encoder import EncoderOps
    from service.backend.cuda.gemm import gemm
    from service.backend.cuda.loader import CudaDims

    rng = np.random.default_rng(seed)
    M, K, N, nt = row["M"], row["K"], row["N"], row["nt"]
    a = cupy.asarray(rng.standard_normal((M, K), dtype=np.float32))
    b = cupy.asarray(rng.standard_normal((N, K) if nt else (K, N), dtype=np.float32))
    side = cupy.asarray(
        np.abs(rng.standard_normal(N, dtype=np.float32))
        if row["fused"] == "bias_relu"
        else np.maximum(rng.standard_normal((M, N), dtype=np.float32), 0)
    )
    ops = EncoderOps(CudaDims(D=D, H=N, A=9, Z=51, K=3))
    def timed(fn: Callable[[], object]) -> float:
        return time_launches(fn, repeats, blocks)

    cells = {
        "cublas_us": timed(lambda: gemm(a, b, False, nt)),
        "tf32x3_64_us": timed(lambda: tensor_core_gemm(a, b, nt, tile_m=64)),
        "tf32x3_128_us": timed(lambda: tensor_core_gemm(a, b, nt, tile_m=128)),
        "tf32x3_us": timed(lambda: tensor_core_gemm(a, b, nt)),
    }
    if row["fused"] == "bias_relu":
        cells["unfused_cublas_us"] = timed(lambda: ops.bias_relu_fwd(gemm(a, b), side))
    elif row["fused"] == "relu_gate":
        cells["unfused_cublas_us"] = timed(lambda: ops.bias_relu_bwd(side, gemm(a, b, False, True)))
    if row["fused"]:
        cells["fused_us"] = timed(lambda: tensor_core_gemm(a, b, nt, row["fused"], side))
    flops = 2.0 * M * N * K
    best = min(cells["tf32x3_64_us"], cells["tf32x3_128_us"])
    return {
        **row,
        **cells,
        "tflops_cublas": flops / cells["cublas_us"] / 1e6,
        "tflops_tf32x3": flops / cells["tf32x3_us"] / 1e6,
        "speedup": cells["cublas_us"] / cells["tf32x3_us"],
        "picked_best_tile": cells["tf32x3_us"] <= 1.02 * best,
    }


def print_table(results: list[dict]) -> None:
    head = (f"| {'GEMM':<20} | {'M x K x N':>16} | cuBLAS µs | tf32x3 µs (64 / 128) | speedup |"
            " TFLOP/s cuBLAS / ours | unfused / fused µs |")  # fmt: skip
    print(head)
    print("|" + "|".join("-" * (len(part)) for part in head.split("|")[1:-1]) + "|")
    for r in results:
        fused = (
            f"{r['unfused_cublas_us']:.1f} / {r['fused_us']:.1f}" if "fused_us" in r else "-"
        )
        print(
            f"| {r['name']:<20} | {r['M']:>5}x{r['K']:>4}x{r['N']:>4} | {r['cublas_us']:9.1f} |"
            f" {r['tf32x3_us']:6.1f} ({r['tf32x3_64_us']:.1f} / {r['tf32x3_128_us']:.1f})"
            f" | {r['speedup']:6.2f}x | {r['tflops_cublas']:7.1f} / {r['tflops_tf32x3']:.1f}"
            f" | {fused} |"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=4096, help="B: rollout rows = replay rows")
    parser.add_argument("--repeats", type=int, default=50, help="launches per timed block")
    parser.add_argument("--blocks", type=int, default=7, help="timed blocks per cell")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("bench/results/gemm.json"))
    args = parser.parse_args(argv)
    try:
        import cupy

        device = cupy.cuda.Device()
        name = cupy.cuda.runtime.getDeviceProperties(device.id)["name"].decode()
    except Exception as exc:  # no CuPy or no device: nothing to time
        print(f"bench/gemm.py needs a CUDA device visible to CuPy ({exc})", file=sys.stderr)
        return 2
    started = time.perf_counter()
    results = [measure(row, args.repeats, args.blocks, args.seed) for row in shapes(args.batch)]
    record = {
        "command": " ".join(["python3", "bench/gemm.py", *(argv or sys.argv[1:])]),
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "device": name,
        "machine": host_report.machine(),
        "versions": host_report.versions(["cupy-cuda13x", "numpy"]),
        "batch": args.batch,
        "seconds": round(time.perf_counter() - started, 1),
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"{name}, B = {args.batch}; JSON: {args.out}")
    print_table(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
