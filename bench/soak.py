"""Soak: N `trident actor` processes train one `trident serve` (NumPy backend) for a while.

    make soak                                     # 16 actors, 600 s
    python bench/soak.py --actors 4 --duration 60

The server is a real subprocess on 127.0.0.1 (ports picked by the OS) with LobSim's model shape
and a bearer token (random per run); each actor runs `--num-envs` LobSim markets and stops by
itself after `--duration` seconds (`trident actor --duration`), printing a `done:` line with its
Step count and its own Step and Act wall-time p50 / p99. While they run, the script samples the
server's VmRSS and /metrics.
Criteria, each a line of the table and an entry of `failures`:

- errors: 0. Counted: actor exit codes, actor stderr output, rollouts dropped (the server runs
  its default Step queue and policy lag, which drop none under this load), actors
  without a `done:` line, the server's `trident_rpc_errors_total` (every method and code),
  `trident_checkpoint_failures_total`, server log lines at WARNING / ERROR or not JSON, and
  the server's exit status after SIGTERM.
- Steps: the actors' trained rollouts add up to the server's `trident_rollouts_total` less
  `trident_rollouts_dropped_total`, and their env steps to `trident_samples_total` (the server
  trains them side by side, several rollouts a Step).
- RSS drift: the slope of a least-squares line through the server's VmRSS after the warm-up,
  in % per 10 minutes (see `rss_drift`), below `--max-drift-pct`.
- `promtool check metrics` on the last scrape: exit 0 and no output.

Latency is recorded, not bounded: the actors' own p50 / p99 (an RPC's whole wall time, queueing
behind the other actors' Steps included) and the server's histograms (the engine's Step and the
batched Act forward). Writes JSON (command, date, machine, settings, figures, RSS series) to
--out and exits 1 when a criterion fails.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from service.config import LobsimConfig
from service.lobsim.env import LABEL_DIM, NUM_ACTIONS, observation_dim
from service.testing import host_report
from service.testing.serverproc import ServerProcess, clean_env, die_with_parent

TEN_MINUTES_S = 600.0
PEAK_BIN_S = 3.0  # the RSS line has a point every such span (rss_drift)
ENVELOPE_S = 6.0  # ... the largest sample of the span of this length that ends with it
PACKAGES = ("numpy", "grpcio", "protobuf", "prometheus-client", "trident")  # versions recorded
TOKEN = "<random per run>"  # what the report shows of the bearer token
STARTUP_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 60.0
DONE = re.compile(
    r"^done: (?P<sent>\d+) rollouts \((?P<applied>\d+) trained in (?P<server_steps>\d+) Steps, "
    r"(?P<dropped>\d+) dropped behind the policy lag, (?P<dropped_ahead>\d+) dropped ahead of "
    r"the server's state\), (?P<acts>\d+) Acts, (?P<env_steps>\d+) env steps "
    r"\((?P<trained_pct>[\d.]+) % trained, (?P<unfinished>\d+) in unfinished rollouts\) in "
    r"(?P<seconds>[\d.]+) s at \d+ env steps/s \| global step \d+(?:/\d+)? \| "
    r"Step p50 (?P<step_p50>[\d.]+) ms p99 (?P<step_p99>[\d.]+) ms \| "
    r"Act p50 (?P<act_p50>[\d.]+) ms p99 (?P<act_p99>[\d.]+) ms \| "
    r"(?P<rollouts>\d+) rollouts, (?P<resent>\d+) resent, (?P<replayed>\d+) replayed, "
    r"(?P<reconnects>\d+) reconnects \| durable: "
)


@dataclass(frozen=True)
class Settings:
    """What a soak runs and the bound on RSS drift it checks."""

    actors: int = 16
    duration_s: float = 600.0
    num_envs: int = 4  # LobSim markets per actor
    rollout_len: int = 16
    # Small enough to fill during the warm-up, so that the drift does not count the replay
    # buffer's own pages being touched for the first time.
    replay_capacity: int = 16_384
    # The applied Steps' keys the server remembers (server.step_key_window): the ledger grows
    # until it holds this many, so a short soak sets it to fill during the warm-up too.
    step_key_window: int = 4096
    warmup_frac: float = 0.1  # RSS before this share of the run (or the replay filling) is left out
    max_drift_pct: float = 1.0  # per 10 minutes
    seed: int = 0

    def server_sets(self, token: str) -> list[str]:
        """The server's `--set` settings: LobSim's model shape on the NumPy backend, a bearer
        token (so every call passes the auth interceptor, as deployed), defaults otherwise (the
        Step queue and the policy lag too: at the defaults no rollout is dropped), except:

        - `replay.capacity` and `server.step_key_window` (see above);
        - `train.lr_schedule` = constant: a soak has a length in seconds, not Steps, and a
          linear schedule's end is a warning in the server's log."""
        return [
            "train.backend=numpy",
            f"model.obs_dim={observation_dim(LobsimConfig())}",
            f"model.num_actions={NUM_ACTIONS}",
            f"model.aux_dim={LABEL_DIM}",
            f"replay.capacity={self.replay_capacity}",
            f"server.step_key_window={self.step_key_window}",
            f"train.seed={self.seed}",
            "train.lr_schedule=constant",
            f"server.auth_token={token}",
        ]

    @property
    def sample_interval_s(self) -> float:
        """Between two RSS / metrics samples: 1 s, shorter for runs under 10 minutes."""
        return min(1.0, max(0.25, self.duration_s / TEN_MINUTES_S))


# ------------------------------------------------------------------------------- processes
def spawn(
    command: list[str], cwd: Path, stdout: IO[str] | int, stderr: IO[str] | int
) -> subprocess.Popen[str]:
    """Start `command` with no TRIDENT_* variables; it gets SIGTERM if the soak dies."""
    return subprocess.Popen(
        command,
        cwd=cwd,
        env=clean_env(),
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=stderr,
        text=True,
        preexec_fn=die_with_parent,
    )


def stop(process: subprocess.Popen[str], timeout_s: float) -> int:
    """SIGTERM if still running, wait `timeout_s`, then SIGKILL; the exit status."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


def problems(server: ServerProcess) -> list[str]:
    """The server's log lines at WARNING or ERROR, and those that are not JSON objects."""
    found = []
    for line in server.lines:
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not isinstance(record, dict) or record.get("level") in ("WARNING", "ERROR"):
            found.append(line)
    return found


def rss_bytes(pid: int) -> int | None:
    """A running process's VmRSS."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return None


def actor_command(settings: Settings, target: str, index: int, token: str) -> list[str]:
    return [
        sys.executable, "-m", "service.cli", "actor", "--server", target, f"--token={token}",
        "--env", "lobsim", "--num-envs", str(settings.num_envs),
        "--rollout-len", str(settings.rollout_len),
        "--duration", f"{settings.duration_s:g}", "--steps", str(2**62),
        "--seed", str(settings.seed + index), "--log-every", "100",
    ]  # fmt: skip


# ------------------------------------------------------------------------------- metrics
Samples = dict[str, list[tuple[dict[str, str], float]]]


def parse_metrics(text: str) -> Samples:
    """Every sample of a scrape, by sample name: [(labels, value)]."""
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def total(samples: Samples, name: str) -> float:
    """The sum of every series of `name` (0 when absent)."""
    return sum(value for _, value in samples.get(name, []))


def histogram(samples: Samples, name: str) -> dict[str, float | None]:
    """Count, mean and p50 / p99 of histogram `name`, the quantiles interpolated within buckets
    as PromQL's histogram_quantile does (a quantile in the +Inf bucket reads as the highest
    finite bound)."""
    buckets = sorted((float(labels["le"]), value) for labels, value in samples[f"{name}_bucket"])
    count = total(samples, f"{name}_count")
    figures: dict[str, float | None] = {
        "count": count,
        "mean_ms": 1e3 * total(samples, f"{name}_sum") / count if count else None,
    }
    for q in (0.5, 0.99):
        quantile = None
        if count:
            rank, lower, below = q * count, 0.0, 0.0
            for bound, cumulative in buckets:
                if cumulative >= rank:
                    quantile = lower
                    if math.isfinite(bound):
                        quantile += (bound - lower) * (rank - below) / (cumulative - below)
                    break
                lower, below = bound, cumulative
        figures[f"p{round(q * 100)}_ms"] = None if quantile is None else 1e3 * quantile
    return figures


def promtool_check(promtool: str | None, text: str) -> dict[str, Any]:
    """`promtool check metrics` on a scrape: clean when it exits 0 and prints nothing."""
    if promtool is None:
        return {"ran": False, "clean": False, "output": "promtool not found"}
    done = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    output = (done.stdout + done.stderr).strip()
    return {
        "ran": True,
        "clean": done.returncode == 0 and not output,
        "exit": done.returncode,
        "output": output,
    }


# ------------------------------------------------------------------------------- RSS
def rss_drift(series: list[tuple[float, int, float]], settings: Settings) -> dict[str, Any]:
    """The least-squares line through the VmRSS peaks from `start` (the later of the warm-up
    and the replay buffer being full) to the end of the run: its change over that span in %,
    and its slope in % per 10 minutes, both relative to the line's value at `start`.

    A line through every peak rather than the difference of two windows: the RSS wanders by
    about 1 MiB over minutes (allocator arenas and Python's object pools grow and shrink while
    the memory in use stays flat), which moves a window's median by as much as the drift the
    soak bounds. Peaks rather than every sample: a leak raises the working set's peak, while
    the anonymous memory of a Step's temporaries, handed back to the OS for a while (13 MiB for
    about a second at Steps of 4,096 samples on a Xeon; 11 MiB for 3-4 s every ~15 s at the CI
    soak's Steps on a 2-vCPU EPYC), only lowers some samples, and a line through those tilts
    with where they fall. A point every PEAK_BIN_S, each the largest sample of the ENVELOPE_S
    ending with its span, so that a hand-back longer than one span is passed over too (3 s
    peaks alone tilted the EPYC's flat 82.1 MiB plateau to -2.5 %). `series` holds (seconds
    since the actors started, RSS bytes, trident_samples_total)."""
    D = settings.duration_s
    filled = next((t for t, _, s in series if s >= settings.replay_capacity), None)
    start = max(settings.warmup_frac * D, filled if filled is not None else math.inf)
    figures: dict[str, Any] = {"replay_full_at_s": filled, "start_s": start}
    times = np.array([t for t, _, _ in series if t <= D])
    mib = np.array([rss for t, rss, _ in series if t <= D]) / 2**20
    measured = times >= start
    ends: dict[int, float] = {}  # each span's last sample (the series is in time order)
    for t in times[measured]:
        ends[int((t - start) // PEAK_BIN_S)] = float(t)
    points = np.array([
        (end, mib[(start + (at + 1) * PEAK_BIN_S - ENVELOPE_S <= times) & (times <= end)].max())
        for at, end in sorted(ends.items())
    ])  # fmt: skip
    if start > 0.75 * D or len(points) < 5:
        figures["error"] = "the replay buffer did not fill before the last quarter of the run"
        return figures
    slope, intercept = np.polyfit(points[:, 0], points[:, 1], 1)
    at_start, at_end = intercept + slope * start, intercept + slope * points[-1, 0]
    figures.update(
        start_mib=round(float(at_start), 2),
        end_mib=round(float(at_end), 2),
        min_mib=round(float(mib[measured].min()), 2),
        max_mib=round(float(mib[measured].max()), 2),
        change_pct=round(float(100 * (at_end - at_start) / at_start), 4),
        pct_per_10min=round(float(100 * slope * TEN_MINUTES_S / at_start), 4),
    )
    return figures


def throughput(series: list[tuple[float, int, float]], duration_s: float) -> list[float | None]:
    """Samples trained per second in each tenth of the run (steady progress: no tenth near 0)."""
    rates: list[float | None] = []
    for tenth in range(10):
        inside = [(t, s) for t, _, s in series if tenth <= 10 * t / duration_s < tenth + 1]
        if len(inside) < 2:
            rates.append(None)
            continue
        (t0, s0), (t1, s1) = inside[0], inside[-1]
        rates.append(round((s1 - s0) / (t1 - t0), 1))
    return rates


# ------------------------------------------------------------------------------- the run
def run_soak(settings: Settings, workdir: Path, promtool: str | None) -> dict[str, Any]:
    """Run the soak in `workdir` and return its figures (see `failures` for the verdict)."""
    token = secrets.token_urlsafe(24)
    server = ServerProcess.start(
        workdir,
        settings.server_sets(token),
        startup_timeout_s=STARTUP_TIMEOUT_S,
        dies_with_parent=True,
    )
    actors: list[subprocess.Popen[str]] = []
    logs: list[tuple[Path, Path]] = []
    series: list[tuple[float, int, float]] = []
    max_lag = 0.0
    scrape_failures = 0
    server_exit: int | None = None
    try:
        target = server.target
        started = time.monotonic()
        for index in range(settings.actors):
            out, err = workdir / f"actor{index}.out", workdir / f"actor{index}.err"
            with out.open("w") as stdout, err.open("w") as stderr:
                actors.append(
                    spawn(actor_command(settings, target, index, token), workdir, stdout, stderr)
                )
            logs.append((out, err))
        # Each actor stops after its first Step that ends `duration` after its own start.
        deadline = started + settings.duration_s + STARTUP_TIMEOUT_S + STOP_TIMEOUT_S

        def busy() -> bool:
            return server.proc.poll() is None and any(a.poll() is None for a in actors)

        while busy() and time.monotonic() < deadline:
            try:
                samples = parse_metrics(server.metrics_text())
            except OSError:
                scrape_failures += 1
            else:
                rss = rss_bytes(server.proc.pid)
                if rss is not None:
                    filled = total(samples, "trident_samples_total")
                    series.append((time.monotonic() - started, rss, filled))
                max_lag = max(max_lag, total(samples, "trident_policy_lag"))
            time.sleep(settings.sample_interval_s)
        elapsed = time.monotonic() - started
        unfinished = [i for i, a in enumerate(actors) if a.poll() is None]
        for actor in actors:
            stop(actor, STOP_TIMEOUT_S)
        try:
            text = server.metrics_text()
        except OSError:
            text = ""
    finally:
        for actor in actors:
            stop(actor, STOP_TIMEOUT_S)
        server_exit = server.terminate(STOP_TIMEOUT_S)  # its last lines read before counting
    samples = parse_metrics(text)
    server_problems = problems(server)
    return {
        "elapsed_s": round(elapsed, 1),
        "actors": [
            actor_figures(a, out, err, i in unfinished)
            for i, (a, (out, err)) in enumerate(zip(actors, logs, strict=True))
        ],
        "server": {
            "exit": server_exit,
            "problem_lines": server_problems[:20],
            "problem_line_count": len(server_problems),
            "steps_logged": sum(e["steps"] for e in server.events("steps")),
            "tail": server.lines[-40:] if server_exit != 0 else [],
        },
        "metrics": metric_figures(samples) if text else None,
        "max_policy_lag_sampled": max_lag,
        "scrape_failures": scrape_failures,
        "promtool": promtool_check(promtool, text)
        if text
        else {"ran": False, "clean": False, "output": "no final scrape"},
        "rss": rss_drift(series, settings),
        "samples_per_s_by_tenth": throughput(series, settings.duration_s),
        "rss_series": [[round(t, 2), rss, s] for t, rss, s in series],
    }


def actor_figures(
    actor: subprocess.Popen[str], out: Path, err: Path, unfinished: bool
) -> dict[str, Any]:
    """An actor's exit status, its `done:` line's figures and any stderr output."""
    lines = out.read_text().splitlines()
    done = DONE.match(lines[-1]) if lines else None
    figures: dict[str, Any] = {
        "exit": actor.returncode,
        "unfinished": unfinished,
        "stderr": err.read_text()[-2000:],
        "done": None,
    }
    if done is not None:
        figures["done"] = {k: float(v) if "." in v else int(v) for k, v in done.groupdict().items()}
    else:
        figures["stdout_tail"] = lines[-5:]
    return figures


def metric_figures(samples: Samples) -> dict[str, Any]:
    return {
        "steps_total": total(samples, "trident_steps_total"),
        "global_step": total(samples, "trident_global_step"),
        "samples_total": total(samples, "trident_samples_total"),
        "rollouts_total": total(samples, "trident_rollouts_total"),
        "rollouts_dropped_total": total(samples, "trident_rollouts_dropped_total"),
        "rpc_errors_total": total(samples, "trident_rpc_errors_total"),
        "rpc_errors": {
            f"{labels['method']} {labels['code']}": value
            for labels, value in samples.get("trident_rpc_errors_total", [])
            if value
        },
        "checkpoint_failures_total": total(samples, "trident_checkpoint_failures_total"),
        "skipped_updates_total": total(samples, "trident_skipped_updates_total"),
        "step_engine": histogram(samples, "trident_step_duration_seconds"),
        "act_forward": histogram(samples, "trident_act_duration_seconds"),
        "act_batch_mean": total(samples, "trident_act_batch_size_sum")
        / max(1.0, total(samples, "trident_act_batch_size_count")),
    }


def summary(results: dict[str, Any], rollout_env_steps: int) -> dict[str, Any]:
    """Errors, rollout counts and the actors' latency over all actors (each rollout
    `rollout_env_steps` env steps)."""
    actors = results["actors"]
    done = [a["done"] for a in actors if a["done"] is not None]
    metrics = results["metrics"] or {}
    errors = {
        "actor_exit_nonzero": sum(a["exit"] != 0 for a in actors),
        "actor_without_done_line": len(actors) - len(done),
        "actor_unfinished": sum(a["unfinished"] for a in actors),
        "actor_stderr": sum(bool(a["stderr"].strip()) for a in actors),
        "rollouts_dropped_stale": sum(d["dropped"] + d["dropped_ahead"] for d in done),
        "server_rpc_errors": int(metrics.get("rpc_errors_total", 0)),
        "server_checkpoint_failures": int(metrics.get("checkpoint_failures_total", 0)),
        "server_problem_log_lines": results["server"]["problem_line_count"],
        "server_exit_nonzero": int(results["server"]["exit"] != 0),
        "no_final_scrape": int(not metrics),
        "scrape_failures": results["scrape_failures"],
    }

    def spread(key: str) -> dict[str, float | None]:
        values = [d[key] for d in done]
        return {
            "min": min(values, default=None),
            "median": median(values),
            "max": max(values, default=None),
        }

    return {
        "errors": errors,
        "error_count": sum(errors.values()),
        "rollouts_sent": sum(d["sent"] for d in done),
        "rollouts_trained": sum(d["applied"] for d in done),
        "env_steps_trained": sum(d["applied"] for d in done) * rollout_env_steps,
        "acts": sum(d["acts"] for d in done),
        "rollouts_per_actor": spread("sent"),
        # Per-actor quantiles; the pooled p99 is at most the largest actor's p99.
        "step_p50_ms": spread("step_p50"),
        "step_p99_ms": spread("step_p99"),
        "act_p50_ms": spread("act_p50"),
        "act_p99_ms": spread("act_p99"),
    }


def median(values: list[float]) -> float | None:
    return float(np.median(values)) if values else None


def failures(report: dict[str, Any]) -> dict[str, str]:
    """The criteria a report fails, by name: errors, steps, rss, promtool."""
    settings, results, total_ = report["settings"], report["results"], report["summary"]
    failed = {}
    if total_["error_count"]:
        found = {k: v for k, v in total_["errors"].items() if v}
        failed["errors"] = f"expected 0 errors, got {found}"
    metrics = results["metrics"] or {}
    received = metrics.get("rollouts_total", 0) - metrics.get("rollouts_dropped_total", 0)
    if not total_["rollouts_trained"] or total_["rollouts_trained"] != received:
        failed["steps"] = (
            f"expected the actors' trained rollouts ({total_['rollouts_trained']}) > 0 and equal "
            f"to trident_rollouts_total less trident_rollouts_dropped_total ({received})"
        )
    elif total_["env_steps_trained"] != metrics.get("samples_total"):
        failed["steps"] = (
            f"expected the actors' trained env steps ({total_['env_steps_trained']}) to equal "
            f"trident_samples_total ({metrics.get('samples_total')})"
        )
    rss = results["rss"]
    if "error" in rss:
        failed["rss"] = f"RSS drift not measurable: {rss['error']}"
    elif not abs(rss["pct_per_10min"]) < settings["max_drift_pct"]:
        failed["rss"] = (
            f"expected |RSS drift| < {settings['max_drift_pct']} % per 10 minutes, got "
            f"{rss['pct_per_10min']:+.3f} % ({rss['start_mib']} -> {rss['end_mib']} MiB)"
        )
    if not results["promtool"]["clean"]:
        failed["promtool"] = f"promtool check metrics: {results['promtool']['output']!r}"
    return failed


# ------------------------------------------------------------------------------- report
def soak(settings: Settings, workdir: Path, promtool: str | None) -> dict[str, Any]:
    """`run_soak` with the report around it: command, date, machine, settings, summary."""
    busy, own, began = host_report.cpu_busy_s(), host_report.own_cpu_s(), time.monotonic()
    load = os.getloadavg()
    results = run_soak(settings, workdir, promtool)
    wall = time.monotonic() - began
    busy_after, own_after = host_report.cpu_busy_s(), host_report.own_cpu_s()
    foreign_share = None  # CPU time other processes used during the run, as a machine share
    if busy is not None and busy_after is not None:
        foreign = max(0.0, busy_after - busy - (own_after - own))
        foreign_share = round(foreign / (wall * (os.cpu_count() or 1)), 4)
    return {
        "command": shlex.join([sys.executable, *sys.argv]),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": host_report.machine(),
        "versions": host_report.versions(PACKAGES),
        "load_avg_before_after": [list(load), list(os.getloadavg())],
        "other_processes_cpu_share": foreign_share,
        "settings": {
            **asdict(settings),
            "server_set": settings.server_sets(TOKEN),
            "actor_command": shlex.join(actor_command(settings, "HOST:PORT", 0, TOKEN)),
        },
        "summary": summary(results, settings.rollout_len * settings.num_envs),
        "results": results,
        "runtime_s": round(wall, 1),
    }


def print_table(report: dict[str, Any], failed: dict[str, str]) -> None:
    s, total_, results = report["settings"], report["summary"], report["results"]
    metrics, rss = results["metrics"] or {}, results["rss"]

    def ms(figures: dict[str, Any], key: str) -> str:
        value = figures.get(key)
        return "n/a" if value is None else f"{value:.1f}"

    def mark(name: str) -> str:
        return "FAIL" if name in failed else "ok"

    drift = (
        rss.get("error")
        or f"{rss['pct_per_10min']:+.3f} %/10 min ({rss['start_mib']} -> {rss['end_mib']} MiB)"
    )
    step, act = metrics.get("step_engine", {}), metrics.get("act_forward", {})
    rates = [r for r in results["samples_per_s_by_tenth"] if r is not None]
    rows = [
        ("errors", str(total_["error_count"]), "0", mark("errors")),
        ("rollouts: actors trained / trident_rollouts_total",
         f"{total_['rollouts_trained']} / {metrics.get('rollouts_total', float('nan')):.0f}",
         "equal", mark("steps")),
        ("env steps: actors trained / trident_samples_total",
         f"{total_['env_steps_trained']} / {metrics.get('samples_total', float('nan')):.0f}",
         "equal", mark("steps")),
        ("Steps applied (trident_steps_total)", f"{metrics.get('steps_total', float('nan')):.0f}",
         "", ""),
        ("server RSS drift", drift, f"< {s['max_drift_pct']} %", mark("rss")),
        ("promtool check metrics", results["promtool"]["output"] or "clean", "clean",
         mark("promtool")),
        ("Step RPC p50 / p99 ms (actors: median / max)",
         f"{ms(total_['step_p50_ms'], 'median')} / {ms(total_['step_p99_ms'], 'max')}", "", ""),
        ("Act RPC p50 / p99 ms (actors: median / max)",
         f"{ms(total_['act_p50_ms'], 'median')} / {ms(total_['act_p99_ms'], 'max')}", "", ""),
        ("engine Step p50 / p99 ms (histogram)",
         f"{ms(step, 'p50_ms')} / {ms(step, 'p99_ms')}", "", ""),
        ("Act forward p50 / p99 ms (histogram)",
         f"{ms(act, 'p50_ms')} / {ms(act, 'p99_ms')}", "", ""),
        ("Acts / rollouts sent", f"{total_['acts']} / {total_['rollouts_sent']}", "", ""),
        ("rollouts per actor: min / max",
         f"{total_['rollouts_per_actor']['min']} / {total_['rollouts_per_actor']['max']}", "",
         ""),
        ("samples/s by tenth of the run: min / max",
         f"{min(rates, default=None)} / {max(rates, default=None)}", "", ""),
    ]  # fmt: skip
    share = report["other_processes_cpu_share"]
    print(
        f"\nSoak: {s['actors']} actors x {s['num_envs']} LobSim markets, rollouts "
        f"{s['rollout_len']}x{s['num_envs']}, {s['duration_s']:g} s; ran {report['runtime_s']} s, "
        f"other processes' CPU share {'unknown' if share is None else f'{share:.1%}'}"
    )
    width = max(len(r[0]) for r in rows)
    value_width = max(len(r[1]) for r in rows)
    for name, value, limit, ok in rows:
        print(f"{name:<{width}}  {value:<{value_width}}  {limit:<8}  {ok}")
    for name, message in failed.items():
        print(f"FAILED {name}: {message}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    defaults = Settings()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--actors", type=int, default=defaults.actors)
    parser.add_argument("--duration", type=float, default=defaults.duration_s, help="seconds")
    parser.add_argument(
        "--num-envs", type=int, default=defaults.num_envs, help="LobSim markets per actor"
    )
    parser.add_argument("--rollout-len", type=int, default=defaults.rollout_len)
    parser.add_argument("--replay-capacity", type=int, default=defaults.replay_capacity)
    parser.add_argument("--warmup-frac", type=float, default=defaults.warmup_frac)
    parser.add_argument(
        "--max-drift-pct",
        type=float,
        default=defaults.max_drift_pct,
        help="bound on |RSS drift|, %% per 10 minutes",
    )
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--out", type=Path, default=Path("bench/results/soak.json"))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = Settings(
        actors=args.actors,
        duration_s=args.duration,
        num_envs=args.num_envs,
        rollout_len=args.rollout_len,
        replay_capacity=args.replay_capacity,
        warmup_frac=args.warmup_frac,
        max_drift_pct=args.max_drift_pct,
        seed=args.seed,
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # clean up the children first
    with tempfile.TemporaryDirectory(prefix="trident-soak-") as tmp:
        report = soak(settings, Path(tmp), shutil.which("promtool"))
    failed = failures(report)
    report["failures"] = failed
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print_table(report, failed)
    print(f"wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
