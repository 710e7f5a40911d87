"""Prometheus metrics of the trainer service, on a registry of their own (tests make fresh ones)."""

from __future__ import annotations

import time

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Summary

from service.server.status import REASONS
from service.types import HEADS, CheckpointInfo, StepResult

LOSS_LABELS = (*HEADS, "total")  # `total`: the λ-weighted sum
CHECKPOINT_FAILURES = ("disk_full", "error")  # trident_checkpoint_failures_total's reasons


class Metrics:
    """Every `trident_*` series the server exports."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        ns = {"namespace": "trident", "registry": registry}
        self.step_duration = Histogram(
            "step_duration",
            "Wall time of one applied Step on the server.",
            unit="seconds",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            **ns,
        )
        self.loss = Gauge("loss", "Loss of each head in the last Step.", ["head"], **ns)
        self.steps = Counter("steps", "Steps applied.", **ns)
        self.steps_replayed = Counter(
            "steps_replayed",
            "Keyed Steps sent again and answered from the ledger or joined, not applied again.",
            **ns,
        )
        self.samples = Counter("samples", "Rollout samples (T x N) trained on.", **ns)
        self.rollouts = Counter(
            "rollouts",
            "Rollouts handed to the learner: Interact streams' and Step requests' (a replayed "
            "or joined key not counted again).",
            **ns,
        )
        self.rollouts_dropped = Counter(
            "rollouts_dropped",
            "Rollouts the learner did not train on, by reason: behind (older than "
            "train.max_policy_lag allows), ahead (newer than the server's state, which went back "
            "to a checkpoint), abandoned (its caller left first), shutdown (a drain's grace ran "
            "out), key_reused (a key held for other content), key_forgotten (a key older than "
            "the ledger remembers).",
            ["reason"],
            **ns,
        )
        self.step_rollouts = Histogram(
            "step_rollouts",
            "Rollouts trained side by side in one applied Step.",
            buckets=tuple(2**k for k in range(11)),  # 1 .. 1,024
            **ns,
        )
        self.interact_streams = Gauge(
            "interact_streams", "Interact streams open (actors acting through the server).", **ns
        )
        self.rpcs_limited = Counter(
            "rpcs_limited",
            "Calls refused RESOURCE_EXHAUSTED by an admission bound, and calls ended for "
            "waiting on their client too long, by method and limit (the setting: "
            "server.max_streams, server.max_concurrent_rpcs, server.max_control_rpcs, "
            "server.stream_idle_s, server.request_receive_s).",
            ["method", "limit"],
            **ns,
        )
        self.grad_norm = Gauge("grad_norm", "Global gradient norm before clipping.", **ns)
        self.skipped_updates = Counter(
            "skipped_updates", "Updates left unapplied by the non-finite guard.", **ns
        )
        self.act_duration = Histogram(
            "act_duration",
            "Wall time of one batched Act forward on the published policy.",
            unit="seconds",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            **ns,
        )
        self.interact_request_duration = Histogram(
            "interact_request_duration",
            "Wall time of one Interact request in the server's handler: from its arrival, "
            "decoded, to its actions handed to gRPC (a wait for the stream's previous Step "
            "included).",
            unit="seconds",
            buckets=(0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 1, 5),
            **ns,
        )
        self.episode_return = Summary(
            "episode_return",
            "Returns of the episodes that ended on Interact streams: each environment's rewards "
            "summed from its episode's first step on the stream (rate of _sum / rate of _count: "
            "the mean return).",
            **ns,
        )
        self.act_batch_size = Histogram(
            "act_batch_size",
            "Observations per batched Act forward (server.act_max_batch at most).",
            buckets=tuple(2**k for k in range(17)),  # 1 .. 65,536
            **ns,
        )
        self.checkpoint_duration = Histogram(
            "checkpoint_duration",
            "Wall time of a checkpoint save.",
            unit="seconds",
            buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300),
            **ns,
        )
        self.checkpoint_bytes = Gauge(
            "checkpoint", "Size of the last checkpoint.", unit="bytes", **ns
        )
        self.checkpoint_timestamp = Gauge(
            "checkpoint_timestamp",
            "Unix time of the last committed checkpoint.",
            unit="seconds",
            **ns,
        )
        self.checkpoint_failures = Counter(
            "checkpoint_failures",
            "Checkpoints (periodic, asked for, a drain's final) that could not be written, by "
            "reason: disk_full (no space or quota left on the checkpoint volume), error "
            "(anything else).",
            ["reason"],
            **ns,
        )
        self.rpc_errors = Counter(
            "rpc_errors", "RPCs answered with an error status.", ["method", "code"], **ns
        )
        self.device_memory = Gauge(
            "device_memory", "Bytes the backend holds for the trainer.", unit="bytes", **ns
        )
        self.policy_lag = Gauge(
            "policy_lag", "Policy lag of the last Step's oldest rollout.", **ns
        )
        self.approx_kl = Gauge("approx_kl", "Approximate KL of the last Step.", **ns)
        self.clip_fraction = Gauge("clip_fraction", "PPO clip fraction of the last Step.", **ns)
        self.c51_support_clip_ratio = Gauge(
            "c51_support_clip_ratio", "Share of C51 target mass clipped at the support ends.", **ns
        )
        self.global_step = Gauge("global_step", "Applied Steps (the policy version).", **ns)
        self.learning_rate = Gauge(
            "learning_rate", "The rate the next Step trains at (train.lr_schedule).", **ns
        )
        self.lr_schedule_steps = Gauge(
            "lr_schedule_steps",
            "The learning-rate schedule's horizon, train.steps (0: a run with no end, a "
            "constant rate); with global_step, where the schedule stands.",
            **ns,
        )
        self.front_end_restarts = Counter(
            "front_end_restarts",
            "Front-end processes (server.front_ends) that died while the server ran and were "
            "replaced.",
            **ns,
        )
        self.step_queue_depth = Gauge(
            "step_queue_depth", "Rollouts and Step requests waiting for the learner.", **ns
        )
        for head in LOSS_LABELS:
            self.loss.labels(head=head)
        for reason in REASONS:
            self.rollouts_dropped.labels(reason=reason)
        for reason in CHECKPOINT_FAILURES:
            self.checkpoint_failures.labels(reason=reason)
        # rpc_errors' (method, code) series appear with their first error: made up front, the
        # 9 methods x 16 codes were most of a scrape's lines, all zeros.

    def observe_step(self, result: StepResult, samples: int, seconds: float, rollouts: int) -> None:
        if result.updates_skipped:
            self.skipped_updates.inc(result.updates_skipped)
        if not result.updates_applied:
            return
        self.step_duration.observe(seconds)
        self.step_rollouts.observe(rollouts)
        self.steps.inc()
        self.samples.inc(samples)
        for head, value in result.losses.items():
            self.loss.labels(head=head).set(value)
        self.grad_norm.set(result.grad_norm)
        self.policy_lag.set(result.policy_lag)
        self.approx_kl.set(result.approx_kl)
        self.clip_fraction.set(result.clip_fraction)
        self.c51_support_clip_ratio.set(result.c51_support_clip_ratio)
        self.global_step.set(result.global_step)

    def observe_act(self, batch_size: int, seconds: float) -> None:
        self.act_batch_size.observe(batch_size)
        self.act_duration.observe(seconds)

    def observe_checkpoint(self, info: CheckpointInfo) -> None:
        if info.save_ms is not None:  # a save always records it; old checkpoints may not
            self.checkpoint_duration.observe(info.save_ms / 1000)
        self.checkpoint_bytes.set(info.size_bytes)
        self.checkpoint_timestamp.set(time.time())

    def refused(self, method: str, limit: str) -> None:
        """A call refused RESOURCE_EXHAUSTED by the admission bound `limit`."""
        self.rpcs_limited.labels(method=method, limit=limit).inc()
        self.rpc_error(method, grpc.StatusCode.RESOURCE_EXHAUSTED)

    def ended_waiting(self, method: str, limit: str) -> None:
        """A call ended for waiting on its client past `limit` (server.stream_idle_s,
        server.request_receive_s)."""
        self.rpcs_limited.labels(method=method, limit=limit).inc()

    def rpc_error(self, method: str, code: grpc.StatusCode) -> None:
        self.rpc_errors.labels(method=method, code=code.name).inc()
