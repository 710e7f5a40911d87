"""Time one trainer update on the GPU: Trident's captured update, eager PyTorch, CUDA-graphed
PyTorch, and the floor the hardware allows.

One update = one minibatch through every head: B rollout rows stacked on B replay rows through
the encoder (D=40, H=256, depth 2), the pi / v / bce / aux heads on the rollout rows (PPO,
value, BCE and MSE losses), the C51 head (A=9, Z=51) on the replay rows with the target
network's forward, the categorical projection and the cross-entropy, then backward, the
global-norm clip, AdamW on every tensor and the Polyak refresh of the target. float32 with
TF32 off, or at --precision tf32 / bf16 (Trident's train.precision, torch at the same).

    PYTHONPATH=. python3 bench/gpu_step.py                    # B = 256 1024 4096 16384
    PYTHONPATH=. python3 bench/gpu_step.py --sizes 4096 --repeats 200
    python bench/gpu_step.py --device cpu --sizes 64          # dry run of the eager path

Columns
    trident   Trident's captured update (see `TRIDENT_ENTRY` below). Where it cannot be
              imported the column reads "not available: ..." and no number is printed or
              recorded.
    eager     the update written plainly in PyTorch eager mode (bench/torch_update.py, shared
              with bench/cpu_step.py's torch twin), default `torch.optim.AdamW` (foreach).
    graph     the same code captured whole in one `torch.cuda.CUDAGraph`: forward, backward,
              clip_grad_norm_, AdamW(capturable=True), target refresh; static inputs, the
              replay rows drawn by `torch.randint` inside the graph.

Each timed update is bracketed by CUDA events and followed by a synchronisation, so a sample
is the time from an idle GPU to the end of the update, host launch overhead included; the
median over --repeats samples is the headline. A back-to-back figure (--b2b updates, then one
device-wide synchronise, wall clock / n) is recorded as a cross-check.

The floor is the largest of: bytes moved (minimal, see `update_bytes`) / 4.3 TB/s, FLOPs
(`update_flops`) / the GEMM rate measured here at the run's precision (fp32 with TF32 off, TF32, or
bf16 operands), and kernel launches per update x 0.9 us,
the launches counted with the profiler over replays of the torch graph (and, when the
Trident column is available, over its updates too).

Trident's captured-update interface (looked up by a guarded import of `TRIDENT_ENTRY`,
"module:Name", default `captured_update:CapturedUpdate` (bench/captured_update.py);
--trident-entry overrides):

    update = CapturedUpdate(config, batch_size, seed=0)
        config      a `service.config.Config` (the one `make_config` below builds: model dims,
                    c51.target_tau, replay.batch_size = replay.min_size = B,
                    ppo.num_minibatches = 1, train.rollout_len * train.num_envs = B);
        batch_size  B: B rollout rows and B replay rows per update.
        The constructor builds the model, optimizer state and target net on the current CUDA
        device, fills the replay to config.replay.capacity rows and one B-row rollout
        minibatch with random data (the distributions of `make_torch_update`), and captures the
        update. It may synchronise.
    update.run() -> None
        Enqueues exactly one full update (replay sample, every head, backward, clip, AdamW,
        target refresh) on CuPy's current stream, and does not synchronise: the caller
        does. The benchmark makes CuPy's current stream torch's current stream
        (`cupy.cuda.ExternalStream`), so torch's CUDA events bracket the update.
    update.launches_per_update: int   (optional) its own count of kernel launches.

The JSON (--out, default bench/results/gpu_step.json; the CPU dry run writes only when --out
is given) holds the command, date, device, versions, the measured ceilings, the FLOP, byte and
launch counts, the floor terms and every sample.
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import importlib
import importlib.metadata
import json
import math
import platform
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from torch_update import TorchUpdate, make_torch_update

from service.testing import host_report

D, H, DEPTH, A, Z, K = 40, 256, 2, 9, 51, 3
DEFAULT_SIZES = (256, 1024, 4096, 16384)
BANDWIDTH_TBS = 4.3  # the floor's HBM rate for the byte term (TB/s), an assumed figure
LAUNCH_US = 0.9  # the floor's cost of one kernel launch inside a graph (us), an assumed figure
TRIDENT_ENTRY = "captured_update:CapturedUpdate"
NOT_BUILT = "not available: the captured Trident update is not built yet"
FLOAT_BYTES = 4  # float32 everywhere; integer indices and labels are counted as 4 bytes too


# ------------------------------------------------------------------------------- counting
@dataclass(frozen=True)
class Dims:
    D: int = D
    H: int = H
    depth: int = DEPTH
    A: int = A
    Z: int = Z
    K: int = K

    @property
    def layers(self) -> list[tuple[int, int]]:
        """(in, out) of every encoder layer."""
        return [(self.D, self.H)] + [(self.H, self.H)] * (self.depth - 1)

    @property
    def small_heads(self) -> int:
        """Output width of the pi, v, bce and aux heads together."""
        return self.A + 2 + self.K


def param_counts(dims: Dims) -> dict[str, int]:
    """Parameter counts (weights + biases) of the online net and of the target net."""
    encoder = sum(i * o + o for i, o in dims.layers)
    q = dims.H * dims.A * dims.Z + dims.A * dims.Z
    small = dims.H * dims.small_heads + dims.small_heads
    return {
        "encoder": encoder,
        "q": q,
        "small_heads": small,
        "online": encoder + q + small,
        "target": encoder + q,
    }


def update_flops(B: int, dims: Dims = Dims()) -> dict[str, int]:
    """GEMM FLOPs (2 per multiply-add) of one update, by term.

    Online encoder on 2B rows: forward, backward dW of every layer and dX of every layer but
    the first (the observations need no gradient). Small heads (pi, v, bce, aux) on B rows:
    forward, dW and dX. Online C51 head on B replay rows: forward over all A x Z logits, and
    backward over the taken action's Z logits only (the other logits get zero gradient).
    Target net on B next-observation rows: encoder and the full C51 head, forward only.
    `floor` is the sum (6.40 GFLOP at B=4096). `dense_q_bwd` is what
    autograd executes (the backward of the gathered logits is a dense A x Z GEMM);
    `taken_only` would also compute only the taken action's online logits. Elementwise
    FLOPs (softmax, losses, AdamW) are left out: under 1 % of the total.
    """
    enc = sum(i * o for i, o in dims.layers)
    enc_dx = sum(i * o for i, o in dims.layers[1:])
    rows = 2 * B
    terms = {
        "encoder_fwd": 2 * rows * enc,
        "encoder_bwd": 2 * rows * enc + 2 * rows * enc_dx,
        "small_heads_fwd": 2 * B * dims.H * dims.small_heads,
        "small_heads_bwd": 4 * B * dims.H * dims.small_heads,
        "q_fwd": 2 * B * dims.H * dims.A * dims.Z,
        "q_bwd_taken_action": 4 * B * dims.H * dims.Z,
        "target_encoder_fwd": 2 * B * enc,
        "target_q_fwd": 2 * B * dims.H * dims.A * dims.Z,
    }
    floor = sum(terms.values())
    q_dense_extra = 4 * B * dims.H * dims.Z * (dims.A - 1)
    q_fwd_extra = 2 * B * dims.H * dims.Z * (dims.A - 1)
    return {
        **terms,
        "floor": floor,
        "dense_q_bwd": floor + q_dense_extra,
        "taken_only": floor - q_fwd_extra,
    }


def update_bytes(B: int, dims: Dims = Dims()) -> dict[str, int]:
    """Minimal bytes moved to and from device memory by one update, by term.

    params: the online parameters are read once by the forward, their gradients written once
    and read once (norm and AdamW fused), AdamW reads parameter, m and v and writes all three:
    9 accesses per online parameter. The target's parameters are read by its forward, and the
    Polyak refresh reads the online value and reads and writes the target: 4 accesses.
    activations: every tensor that must pass between phases is written once and read once:
    the online encoder's layer outputs and their gradients (2B rows each), the small heads'
    logits and their gradients, the online C51 logits (B x A x Z) and the taken action's
    logit gradients (B x Z), the target encoder's layer outputs, its C51 logits and the
    projected distribution (B x Z).
    inputs: read once: the rollout rows (observation, aux targets, action, old log-prob,
    advantage, return, BCE label, row index) and the replay rows (observation, next
    observation, slot, action, reward, done, horizon).
    """
    p = param_counts(dims)
    params = 9 * p["online"] + 4 * p["target"]
    online_acts = 2 * (2 * B * dims.H * dims.depth)  # layer outputs + their gradients
    heads = 2 * B * dims.small_heads + B * dims.A * dims.Z + B * dims.Z
    target_acts = B * dims.H * dims.depth + B * dims.A * dims.Z + B * dims.Z
    activations = 2 * (online_acts + heads + target_acts)  # written once, read once
    inputs = B * (dims.D + dims.K + 6) + B * (2 * dims.D + 5)
    terms = {
        "params": params * FLOAT_BYTES,
        "activations": activations * FLOAT_BYTES,
        "inputs": inputs * FLOAT_BYTES,
    }
    return {**terms, "total": sum(terms.values())}


def floor_terms(
    flops: float,
    nbytes: float,
    launches: int | None,
    gemm_flops_per_s: float | None,
    bandwidth_bytes_per_s: float,
    launch_s: float,
) -> dict[str, Any]:
    """The three floor terms (ms) and the floor, their largest; None where a rate is unknown."""
    terms = {
        "bytes_ms": 1e3 * nbytes / bandwidth_bytes_per_s,
        "flops_ms": 1e3 * flops / gemm_flops_per_s if gemm_flops_per_s else None,
        "launch_ms": 1e3 * launches * launch_s if launches is not None else None,
    }
    known = {k: v for k, v in terms.items() if v is not None}
    bound = max(known, key=known.get)
    return {
        **terms,
        "floor_ms": known[bound],
        "bound_by": bound.removesuffix("_ms"),
        "complete": len(known) == len(terms),
    }


# ------------------------------------------------------------------------------- config
def import_service():
    """`service.config`, imported where a B is measured: the PyTorch rows need no Trident."""
    return importlib.import_module("service.config")


def make_config(B: int, args: argparse.Namespace):
    """The trainer config of one B: the dims above, one minibatch, Polyak every update."""
    config = import_service()
    overrides = [
        "model.dtype=float32",
        f"model.obs_dim={D}",
        f"model.hidden_dim={H}",
        f"model.depth={DEPTH}",
        f"model.num_actions={A}",
        f"model.aux_dim={K}",
        f"c51.num_atoms={Z}",
        f"c51.target_tau={args.tau}",
        f"replay.capacity={max(args.replay_fill, B)}",
        f"replay.batch_size={B}",
        f"replay.min_size={B}",
        "ppo.num_minibatches=1",
        f"train.rollout_len={args.horizon}",
        f"train.num_envs={B // args.horizon}",
        f"train.seed={args.seed}",
        f"train.precision={args.precision}",
    ]
    return config.load_config(env={}, overrides=overrides)


# ------------------------------------------------------------------------------- torch twin
# The eager update (`make_torch_update`, `TorchUpdate`) lives in bench/torch_update.py, shared
# with bench/cpu_step.py's torch column; its data here are random tensors made on the device.


def capture(tu: TorchUpdate, warmup: int):
    """Warm `tu` up on a side stream, as torch requires, then capture one update in a graph."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):  # AdamW state, cuBLAS workspaces, autograd's streams
            tu.update()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tu.update()
    torch.cuda.synchronize()
    return graph


def check_graph_matches_eager(B: int, cfg, warmup: int, seed: int) -> dict:
    """One graph replay and one eager run of the same captured function, from one state.

    Fixed replay rows, so both see the same data; everything the update changes is snapshot
    before and restored (in place, keeping the graph's addresses) between the two. Any
    difference beyond float rounding (index_add_ sums in atomic order) means the capture is
    wrong (a stale input, a host value frozen into the graph).
    """
    import torch

    tu = make_torch_update(B, cfg, "cuda", capturable=True, seed=seed, fixed_replay_rows=True)
    graph = capture(tu, warmup)
    before = [t.detach().clone() for t in tu.state()]
    graph.replay()
    torch.cuda.synchronize()
    via_graph = [t.detach().clone() for t in tu.state()]
    stats_graph = tu.out["stats"].clone()
    with torch.no_grad():
        for t, saved in zip(tu.state(), before, strict=True):
            t.copy_(saved)
    tu.update()  # eagerly, the function that was captured
    torch.cuda.synchronize()
    stats_eager = tu.out["stats"]
    after = [t.detach() for t in tu.state()]
    state_diff = max(float((g - e).abs().max()) for g, e in zip(via_graph, after, strict=True))
    state_close = all(
        torch.allclose(g, e, rtol=1e-5, atol=1e-7) for g, e in zip(via_graph, after, strict=True)
    )
    moved = max(float((g - b).abs().max()) for g, b in zip(via_graph, before, strict=True))
    stats_close = torch.allclose(stats_graph, stats_eager, rtol=1e-4, atol=1e-6)
    stats_rel = float(
        ((stats_graph - stats_eager).abs() / stats_eager.abs().clamp_min(1e-12)).max()
    )
    ok = state_close and stats_close and moved > 0
    return {
        "B": B,
        "ok": bool(ok),
        "max_abs_state_diff": state_diff,
        "max_rel_stats_diff": stats_rel,
        "max_abs_state_change": moved,
        "stats_graph": stats_graph.tolist(),
        "stats_eager": stats_eager.tolist(),
    }


# ------------------------------------------------------------------------------- timing
def summarize(samples: list[float]) -> dict:
    s = np.asarray(samples)
    return {
        "median_ms": float(np.median(s)),
        "p10_ms": float(np.percentile(s, 10)),
        "p90_ms": float(np.percentile(s, 90)),
        "min_ms": float(s.min()),
        "repeats": int(s.size),
        "samples_ms": [round(float(x), 4) for x in s],
    }


def time_cuda(fn: Callable[[], None], warmup: int, repeats: int, b2b: int) -> dict:
    """CUDA-event time of `fn` from an idle GPU, `repeats` times; host launch time alongside;
    then `b2b` calls back to back closed by a device-wide synchronise (wall clock / call)."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    device_ms, host_ms = [], []
    for _ in range(repeats):
        start.record()
        t0 = time.perf_counter()
        fn()
        host_ms.append(1e3 * (time.perf_counter() - t0))
        end.record()
        end.synchronize()
        device_ms.append(start.elapsed_time(end))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(b2b):
        fn()
    torch.cuda.synchronize()
    wall = 1e3 * (time.perf_counter() - t0) / max(b2b, 1)
    result = summarize(device_ms)
    result["host_launch_median_ms"] = float(np.median(host_ms))
    result["back_to_back_ms"] = wall if b2b else None
    return result


def time_cpu(fn: Callable[[], None], warmup: int, repeats: int) -> dict:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(1e3 * (time.perf_counter() - t0))
    return summarize(samples)


def stats_finite(tu: TorchUpdate) -> list[float]:
    """The last update's statistics (one host read); fails on a non-finite value."""
    stats = tu.out["stats"].tolist()
    if not all(math.isfinite(x) for x in stats):
        raise RuntimeError(f"non-finite update statistics {stats}")
    return stats


# ------------------------------------------------------------------------------- ceilings
def measure_gemm_rate(n: int, repeats: int, precision: str = "fp32") -> dict:
    """FLOP/s of an n x n x n torch.mm at `precision` (median of `repeats`): float32 with
    torch's TF32 setting (setup_torch: on only for tf32), or bfloat16 operands."""
    import torch

    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    c = torch.empty(n, n, device="cuda", dtype=dtype)
    for _ in range(2):
        torch.mm(a, b, out=c)
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.mm(a, b, out=c)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    seconds = float(np.median(times))
    del a, b, c
    torch.cuda.empty_cache()
    return {
        "shape": [n, n, n],
        "precision": precision,
        "median_s": seconds,
        "flops_per_s": 2 * n**3 / seconds,
        "tflops": 2 * n**3 / seconds / 1e12,
    }


def measure_copy_bandwidth(mib: int, repeats: int) -> dict:
    """Device-to-device copy rate, bytes read + written per second (median of `repeats`)."""
    import torch

    n = mib * 2**20 // 4
    src = torch.randn(n, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(2):
        dst.copy_(src)
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    seconds = float(np.median(times))
    del src, dst
    torch.cuda.empty_cache()
    moved = 2 * n * 4
    return {
        "bytes_per_copy": moved,
        "median_s": seconds,
        "bytes_per_s": moved / seconds,
        "tb_per_s": moved / seconds / 1e12,
    }


# ------------------------------------------------------------------------------- launches
def count_launches(fn: Callable[[], None], calls: int = 2) -> dict:
    """Device operations (kernels, memsets, memcpys) one call of `fn` puts on the GPU.

    Counted with torch.profiler (CUPTI), which lists the kernels of a graph replay one by
    one, over `calls` calls; `per_call` is the total over `calls`. Device-side mirrors of
    record_function ranges (same name as a CPU-side event, or flagged is_user_annotation) are
    not operations and are left out.
    """
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    events = list(prof.events())
    cpu_names = {e.name for e in events if e.device_type == DeviceType.CPU}
    names: collections.Counter = collections.Counter()
    for e in events:
        if e.device_type != DeviceType.CUDA or getattr(e, "is_user_annotation", False):
            continue
        if e.name in cpu_names:
            continue
        names[e.name] += 1
    total = sum(names.values())
    memsets = sum(c for n, c in names.items() if n.startswith("Memset"))
    memcpys = sum(c for n, c in names.items() if n.startswith("Memcpy"))
    return {
        "per_call": round(total / calls),
        "calls_profiled": calls,
        "whole_multiple": total % calls == 0,
        "kernels": (total - memsets - memcpys) / calls,
        "memsets": memsets / calls,
        "memcpys": memcpys / calls,
        "by_name_per_call": {n[:160]: c / calls for n, c in names.most_common()},
    }


# ------------------------------------------------------------------------------- trident
def load_trident(entry: str) -> tuple[Any, str | None]:
    """(the captured-update class, None), or (None, why it is not available)."""
    module_name, _, attr = entry.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        missing = error.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            return None, f"{NOT_BUILT} (no module {module_name})"
        return None, f"not available: importing {module_name} failed: {error!r}"
    except Exception as error:  # a broken module must not look like a missing one
        return None, f"not available: importing {module_name} failed: {error!r}"
    cls = getattr(module, attr, None)
    if cls is None:
        return None, f"{NOT_BUILT} ({module_name} has no {attr})"
    return cls, None


def on_torch_stream(run: Callable[[], None]) -> Callable[[], None]:
    """`run` with CuPy's current stream set to torch's, so torch's events bracket its work."""
    import cupy
    import torch

    stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)

    def call() -> None:
        with stream:
            run()

    return call


# ------------------------------------------------------------------------------- metadata
def version_of(*dists: str) -> str | None:
    for dist in dists:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def metadata(args: argparse.Namespace) -> dict:
    import torch

    meta: dict[str, Any] = {
        "command": shlex.join([sys.executable, *sys.argv]),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "git_commit": host_report.git_commit(),
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
        "versions": {
            "torch": torch.__version__,
            "torch_cuda": torch.version.cuda,
            "cupy": version_of("cupy-cuda13x", "cupy-cuda12x", "cupy"),
            "numpy": np.__version__,
        },
        "shapes": {
            **asdict(Dims()),
            "dtype": "float32",
            "rollout_rows": "B",
            "replay_rows": "B",
            "replay_filled": args.replay_fill,
            "target_tau": args.tau,
        },
        "settings": {
            "repeats": args.repeats,
            "warmup": args.warmup,
            "back_to_back": args.b2b,
            "capture_warmup": args.capture_warmup,
            "seed": args.seed,
            "bandwidth_tb_per_s_for_floor": args.bandwidth_tbs,
            "launch_us_for_floor": args.launch_us,
            "trident_entry": args.trident_entry,
        },
    }
    if args.device == "cuda":
        props = torch.cuda.get_device_properties(0)
        meta["device"] = {
            "name": props.name,
            "total_memory_gib": round(props.total_memory / 2**30, 1),
            "multiprocessors": props.multi_processor_count,
            "capability": f"{props.major}.{props.minor}",
        }
        meta["settings"]["tf32"] = {
            "cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
        }
        try:  # the newer per-backend setting, where this torch has it
            meta["settings"]["tf32"]["cuda.matmul.fp32_precision"] = getattr(
                torch.backends.cuda.matmul, "fp32_precision", None
            )
        except RuntimeError as error:
            meta["settings"]["tf32"]["cuda.matmul.fp32_precision"] = repr(error)
    else:
        meta["device"] = {"name": "cpu (dry run)"}
    return meta


def write_json(path: Path | None, record: dict) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {path}", file=sys.stderr)


# ------------------------------------------------------------------------------- report
def cell(column: dict | None) -> str:
    if not column or not column.get("available"):
        return "n/a"
    return f"{column['median_ms']:.3f} ({column['p10_ms']:.3f}-{column['p90_ms']:.3f})"


def ratio_cell(r: dict, col: str) -> str:
    value = r.get(f"{col}_over_floor")
    return f"{value:.2f}" if value is not None else "n/a"


def floor_cell(r: dict) -> str:
    """The floor and its binding term; '*' when a term is unknown (no rate or no count)."""
    f = r.get("floor")
    if not f:
        return "n/a"
    return f"{f['floor_ms']:.3f} ({f['bound_by']}){'' if f['complete'] else '*'}"


def print_table(results: list[dict], ceilings: dict, trident_reason: str | None) -> None:
    gemm, copy = ceilings.get("gemm"), ceilings.get("copy")
    if gemm and copy:
        print(
            f"GEMM at {gemm['precision']} {gemm['shape'][0]}^3: {gemm['tflops']:.1f} TFLOP/s; "
            f"D2D copy: {copy['tb_per_s']:.2f} TB/s (read + written); the floor uses "
            f"{ceilings['bandwidth_tb_per_s_for_floor']} TB/s and "
            f"{ceilings['launch_us_for_floor']} us per launch"
        )
    if trident_reason:
        print(f"trident: {trident_reason}")
    print(
        f"{'B':>6} | {'trident ms (p10-p90)':>24} | {'eager ms (p10-p90)':>24} | "
        f"{'graph ms (p10-p90)':>24} | {'GFLOP':>6} | {'MB':>6} | {'launch':>6} | "
        f"{'floor ms (bound)':>20} | {'graph/floor':>11} | {'trident/floor':>13}"
    )
    for r in results:
        launches = r.get("launches", {}).get("graph_for_floor")
        print(
            f"{r['B']:>6} | {cell(r.get('trident')):>24} | {cell(r.get('eager')):>24} | "
            f"{cell(r.get('graph')):>24} | {r['flops']['floor'] / 1e9:6.2f} | "
            f"{r['bytes']['total'] / 1e6:6.1f} | {launches or 'n/a':>6} | "
            f"{floor_cell(r):>20} | {ratio_cell(r, 'graph'):>11} | "
            f"{ratio_cell(r, 'trident'):>13}"
        )
    for r in results:
        f = r.get("floor")
        if f:
            terms = ", ".join(
                f"{k} {v:.4f}" if v is not None else f"{k} n/a"
                for k, v in f.items()
                if k.endswith("_ms") and k != "floor_ms"
            )
            print(f"B={r['B']}: floor terms (ms): {terms}")
    for r in results:
        reason = r.get("trident", {}).get("reason")
        if reason and reason != trident_reason:
            print(f"B={r['B']}: trident: {reason}")
    if any(r.get("floor") and not r["floor"]["complete"] for r in results):
        print(
            "* a floor term is missing (no GEMM rate on the CPU, or no launch count): "
            "the floor shown is only the largest known term"
        )


# ------------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(DEFAULT_SIZES))
    parser.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cpu: a dry run of the eager path (no graph, no ceilings)",
    )
    parser.add_argument("--repeats", type=int, default=100, help="timed updates per column")
    parser.add_argument("--warmup", type=int, default=5, help="untimed updates before timing")
    parser.add_argument(
        "--b2b",
        type=int,
        default=50,
        help="back-to-back updates of the wall-clock cross-check (0: skip)",
    )
    parser.add_argument(
        "--capture-warmup", type=int, default=3, help="side-stream updates before the graph capture"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON path (default bench/results/gpu_step.json on cuda; "
        "the cpu dry run writes only when given)",
    )
    parser.add_argument("--tau", type=float, default=0.005, help="Polyak factor of the target")
    parser.add_argument(
        "--replay-fill", type=int, default=100_000, help="replay rows the sample is drawn from"
    )
    parser.add_argument(
        "--horizon",
        type=int,
        default=16,
        help="rollout T of the config (N = B / T); B must be a multiple",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--precision",
        choices=("fp32", "tf32", "bf16"),
        default="fp32",
        help="Trident's train.precision; the torch columns the same: TF32 matmuls, or "
        "autocast to bfloat16",
    )
    parser.add_argument(
        "--bandwidth-tbs",
        type=float,
        default=BANDWIDTH_TBS,
        help="memory rate of the floor's byte term (TB/s)",
    )
    parser.add_argument(
        "--launch-us",
        type=float,
        default=LAUNCH_US,
        help="cost of one launch in the floor's launch term (us)",
    )
    parser.add_argument("--gemm-n", type=int, default=8192, help="GEMM size of the fp32 rate")
    parser.add_argument("--copy-mib", type=int, default=1024, help="copy size of the bandwidth")
    parser.add_argument(
        "--trident-entry", default=TRIDENT_ENTRY, help="module:Name of the captured update"
    )
    parser.add_argument(
        "--no-launch-count",
        action="store_true",
        help="skip the profiler (no launch term in the floor)",
    )
    parser.add_argument(
        "--no-check", action="store_true", help="skip the graph-replay-equals-eager check"
    )
    args = parser.parse_args(argv)
    for B in args.sizes:
        if B <= 0 or B % args.horizon:
            parser.error(f"B = {B} must be a positive multiple of --horizon {args.horizon}")
    if args.out is None and args.device == "cuda":
        args.out = Path("bench/results/gpu_step.json")
    return args


def setup_torch(device: str, precision: str = "fp32"):
    """torch with TF32 off (on for --precision tf32), or exit with a message when it or the
    device is missing."""
    try:
        import torch
    except ImportError as error:
        sys.exit(f"gpu_step: PyTorch is needed ({error})")
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit(
            "gpu_step: no CUDA device visible to PyTorch (torch.cuda.is_available() is "
            "False); run it on the GPU host, or use --device cpu for a dry run"
        )
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    return torch


def autocast_dtype(precision: str):
    """The dtype the torch columns autocast to at `precision` (None: none)."""
    import torch

    return torch.bfloat16 if precision == "bf16" else None


def run_sizes(
    args: argparse.Namespace, trident_cls, trident_reason: str | None, ceilings: dict, record: dict
) -> list[dict]:
    """Time every column at every B, then count the launches and work out the floors."""
    import torch

    cuda = args.device == "cuda"
    dims = Dims()
    results: list[dict] = []
    live: list[dict] = []  # per B, the objects the launch count needs after all the timing
    for B in args.sizes:
        cfg = make_config(B, args)
        r: dict[str, Any] = {"B": B, "flops": update_flops(B, dims), "bytes": update_bytes(B, dims)}
        objs: dict[str, Any] = {}
        # eager
        cast = autocast_dtype(args.precision)
        eager = make_torch_update(
            B, cfg, args.device, capturable=False, seed=args.seed, autocast=cast
        )
        objs["eager"] = eager
        if cuda:
            r["eager"] = time_cuda(eager.update, args.warmup, args.repeats, args.b2b)
        else:
            r["eager"] = time_cpu(eager.update, args.warmup, args.repeats)
        r["eager"].update(available=True, stats_last=stats_finite(eager))
        print(f"B={B:5} eager: median {r['eager']['median_ms']:.3f} ms", file=sys.stderr)
        # graph
        if cuda:
            try:
                tu = make_torch_update(
                    B, cfg, "cuda", capturable=True, seed=args.seed, autocast=cast
                )
                graph = capture(tu, args.capture_warmup)
                r["graph"] = time_cuda(graph.replay, args.warmup, args.repeats, args.b2b)
                r["graph"].update(available=True, stats_last=stats_finite(tu))
                objs["graph_update"], objs["graph"] = tu, graph
                print(f"B={B:5} graph: median {r['graph']['median_ms']:.3f} ms", file=sys.stderr)
            except Exception as error:  # reported, and the other columns still run
                r["graph"] = {
                    "available": False,
                    "reason": f"not available: capture or replay failed: {error!r}",
                }
                print(f"B={B:5} graph: {r['graph']['reason']}", file=sys.stderr)
        else:
            r["graph"] = {
                "available": False,
                "reason": "not available: CUDA graphs need a CUDA device",
            }
        # trident: a number only from a real captured update, never a stand-in
        if trident_cls is None:
            r["trident"] = {"available": False, "reason": trident_reason}
        elif not cuda:
            r["trident"] = {
                "available": False,
                "reason": "not available: the captured update needs a CUDA device",
            }
        else:
            try:
                captured = trident_cls(cfg, B, seed=args.seed)
                run = on_torch_stream(captured.run)
                r["trident"] = time_cuda(run, args.warmup, args.repeats, args.b2b)
                r["trident"]["available"] = True
                r["trident"]["launches_per_update_reported"] = getattr(
                    captured, "launches_per_update", None
                )
                objs["trident"], objs["trident_run"] = captured, run
                print(
                    f"B={B:5} trident: median {r['trident']['median_ms']:.3f} ms", file=sys.stderr
                )
            except Exception as error:  # reported, never a number
                r["trident"] = {
                    "available": False,
                    "reason": f"not available: the captured update failed: {error!r}",
                }
                print(f"B={B:5} trident: {r['trident']['reason']}", file=sys.stderr)
        results.append(r)
        live.append(objs)
        if args.out is not None:
            record["results"] = results
            write_json(args.out, record)  # the timings so far, in case a later step fails

    # Launch counts last, after every timing: the profiler cannot disturb or lose them.
    if cuda and not args.no_launch_count:
        try:  # a first, discarded profile: CUPTI's start-up stays out of the counts
            count_launches(lambda: torch.ones(1, device="cuda").add_(1), calls=1)
        except Exception as error:
            print(f"profiler warm-up failed: {error!r}", file=sys.stderr)
    for r, objs in zip(results, live, strict=True):
        launches: dict[str, Any] = {}
        if cuda and not args.no_launch_count:
            try:
                launches.update(launch_counts(objs))
            except Exception as error:  # the timings stand without it
                launches["error"] = repr(error)
                print(f"B={r['B']}: launch count failed: {error!r}", file=sys.stderr)
        r["launches"] = launches
        add_floor(r, ceilings, args)
    live.clear()
    if cuda:
        torch.cuda.empty_cache()
    return results


def launch_counts(objs: dict) -> dict:
    """Device operations per update of each column, and the count the floor uses."""
    out: dict[str, Any] = {"eager": count_launches(objs["eager"].update)}
    if "graph" in objs:
        out["graph_replay"] = count_launches(objs["graph"].replay)
        if out["graph_replay"]["per_call"] > 0:
            out["graph_for_floor"] = out["graph_replay"]["per_call"]
            out["graph_for_floor_method"] = "profiler, replays of the torch graph"
        else:
            # The profiler saw no kernels of the graph: count the captured function run
            # eagerly (the launches it recorded at capture), and say so.
            eager_run = count_launches(objs["graph_update"].update)
            out["graph_eager_run_of_captured_fn"] = eager_run
            out["graph_for_floor"] = eager_run["per_call"]
            out["graph_for_floor_method"] = (
                "profiler, eager runs of the captured function (the replay showed no kernels)"
            )
    if "trident_run" in objs:
        out["trident"] = count_launches(objs["trident_run"])
    return out


def add_floor(r: dict, ceilings: dict, args: argparse.Namespace) -> None:
    """The floor of r's B (torch graph's launch count; Trident's too when it ran)."""
    gemm = ceilings.get("gemm", {}).get("flops_per_s")
    bw = args.bandwidth_tbs * 1e12
    launch_s = args.launch_us * 1e-6
    launches = r["launches"]
    r["floor"] = floor_terms(
        r["flops"]["floor"],
        r["bytes"]["total"],
        launches.get("graph_for_floor"),
        gemm,
        bw,
        launch_s,
    )
    if "trident" in launches:
        r["floor_trident_launches"] = floor_terms(
            r["flops"]["floor"],
            r["bytes"]["total"],
            launches["trident"]["per_call"],
            gemm,
            bw,
            launch_s,
        )
    if ceilings.get("copy"):
        r["bytes_ms_at_measured_copy_rate"] = (
            1e3 * r["bytes"]["total"] / ceilings["copy"]["bytes_per_s"]
        )
    for col in ("graph", "trident"):
        if r[col].get("available") and r["floor"]["complete"]:
            r[f"{col}_over_floor"] = r[col]["median_ms"] / r["floor"]["floor_ms"]


def main(argv: list[str] | None = None) -> int:
    t0 = time.perf_counter()
    args = parse_args(argv)
    torch = setup_torch(args.device, args.precision)
    import_service()
    trident_cls, trident_reason = load_trident(args.trident_entry)
    record = metadata(args)
    record["trident"] = {
        "entry": args.trident_entry,
        "available": trident_cls is not None,
        "reason": trident_reason,
    }
    record["counting"] = {
        "params": param_counts(Dims()),
        "flops_note": "GEMMs only: online encoder fwd + bwd (no dX of the first layer), small "
        "heads fwd + bwd, online C51 fwd over A x Z and bwd over the taken "
        "action's Z, target encoder + C51 fwd; see update_flops",
        "bytes_note": "see update_bytes in bench/gpu_step.py: parameters (9 online + 4 "
        "target accesses each), activations written once and read once, "
        "inputs read once; float32, indices counted as 4 bytes",
        "launch_note": "kernels + memsets + memcpys on the GPU per update, counted with "
        "torch.profiler over two replays of the torch graph (see graph_for_floor_method)",
    }
    ceilings: dict[str, Any] = {
        "bandwidth_tb_per_s_for_floor": args.bandwidth_tbs,
        "launch_us_for_floor": args.launch_us,
    }
    if args.device == "cuda":
        ceilings["gemm"] = measure_gemm_rate(args.gemm_n, 10, args.precision)
        ceilings["copy"] = measure_copy_bandwidth(args.copy_mib, 10)
        print(
            f"GEMM at {args.precision} {ceilings['gemm']['tflops']:.1f} TFLOP/s, copy "
            f"{ceilings['copy']['tb_per_s']:.2f} TB/s",
            file=sys.stderr,
        )
        if not args.no_check:
            B = min(args.sizes)
            try:
                record["graph_check"] = check_graph_matches_eager(
                    B, make_config(B, args), args.capture_warmup, args.seed
                )
            except Exception as error:
                record["graph_check"] = {"B": B, "ok": False, "error": repr(error)}
            torch.cuda.empty_cache()
            if not record["graph_check"]["ok"]:
                print(
                    "WARNING: the graph replay does not match an eager run of the captured "
                    f"function: {record['graph_check']}",
                    file=sys.stderr,
                )
    record["ceilings"] = ceilings
    results = run_sizes(args, trident_cls, trident_reason, ceilings, record)
    record["results"] = results
    record["runtime_s"] = round(time.perf_counter() - t0, 1)
    print_table(results, ceilings, trident_reason)
    if args.device == "cpu":
        print("dry run on the CPU: eager column only, no ceilings, no floor rates", file=sys.stderr)
    write_json(args.out, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
