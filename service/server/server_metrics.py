"""One Prometheus scrape for the whole server when gRPC runs in front-end processes: the learner's
metrics page shows its own series and the front ends' together.

Each front end counts what its gRPC side sees (calls refused and failed, streams open, Interact
request times, episode returns: `FRONT_END_FAMILIES`) in its own registry. At each scrape the
learner asks every front end for a snapshot (the handoff's ASK; answered by the `metrics`
call, `answer_asks`) and waits up to `ASK_WAIT_S` for them, so a call answered before the
scrape began is on the page; front ends also send one every `PUSH_EVERY_S` and as they drain
(`push_metrics`). The page (`ServerWide`) sums each such series over the learner's own and
every front end's latest snapshot; a front end that is gone leaves its counters, histograms
and summaries in the sum (its gauges, such as streams open, go with it), so nothing counted
goes backwards when a front end is replaced. What a SIGKILLed front end counted after its
last snapshot (at most PUSH_EVERY_S before) is lost.

Chosen over prometheus_client's multiprocess mode: that mode is fixed per process when
prometheus_client is imported (PROMETHEUS_MULTIPROC_DIR), every gauge of the learner's would
need a mode of its own or carry a pid label, and a dead process's files must be tidied; here
the Metrics class and the one-process server stay as they are, and the learner's series are
read live at each scrape.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

from service.handoff import Handoff
from service.server import learner_calls as calls

PUSH_EVERY_S = 1.0
ASK_WAIT_S = 2.0  # a scrape waits this long for the front ends' snapshots, then uses the last
FRONT_END_FAMILIES = frozenset({
    "trident_rpc_errors",
    "trident_rpcs_limited",
    "trident_interact_streams",
    "trident_interact_request_duration_seconds",
    "trident_episode_return",
})  # fmt: skip
Key = tuple[str, tuple[tuple[str, str], ...]]  # a sample's name and sorted labels


def snapshot(registry: CollectorRegistry) -> dict[str, list[list[Any]]]:
    """The front end's families: each as [sample name, labels, value] triples."""
    return {family.name: [[s.name, s.labels, s.value] for s in family.samples]
            for family in registry.collect() if family.name in FRONT_END_FAMILIES}  # fmt: skip


def answer_asks(registry: CollectorRegistry, handoff: Handoff) -> None:
    """Answer each of the learner's ASKs with a snapshot (from the handoff's reader thread:
    the call is sent, not waited for)."""

    def answer(number: int) -> None:
        handoff.call_soon(calls.METRICS, {"families": snapshot(registry), "number": number})

    handoff.on_ask(answer)


def push_metrics(registry: CollectorRegistry, handoff: Handoff, stop: threading.Event) -> None:
    """Send snapshots until `stop` is set (then one more), while the handoff is up."""
    while not stop.wait(PUSH_EVERY_S) and handoff.up:
        handoff.call_soon(calls.METRICS, {"families": snapshot(registry)})
    if handoff.up:
        handoff.call(calls.METRICS, {"families": snapshot(registry)}, timeout_s=5.0)


def _add(into: dict[Key, float], name: str, labels: dict[str, str], value: float) -> None:
    key = (name, tuple(sorted(labels.items())))
    if name.endswith("_created"):  # a series' start: the earliest
        into[key] = min(into.get(key, value), value)
    else:
        into[key] = into.get(key, 0.0) + value


class ServerWide:
    """A collector for the learner's metrics page: `registry`'s series, the front ends' summed
    in (module doc). `ask(number)` sends ASK `number` to the front ends that are up and
    returns their ids (set once the hub is up; until then the page is the learner's)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.ask: Callable[[int], list[int]] = lambda number: []
        self._live: dict[int, dict[str, list[list[Any]]]] = {}
        self._answered: dict[int, int] = {}  # front end -> the newest ASK it answered
        self._gone: set[int] = set()  # front ends that will answer no more
        self._retired: dict[str, dict[Key, float]] = {}
        self._gauges = {family.name for family in registry.collect() if family.type == "gauge"}
        self._asks = itertools.count(1)
        self._changed = threading.Condition()

    def update(self, front_end: int, families: dict[str, list[list[Any]]], number: int = 0
               ) -> None:  # fmt: skip
        """A front end's snapshot (`number`: the ASK it answers; 0: a push)."""
        with self._changed:
            self._live[front_end] = {name: samples for name, samples in families.items()
                                     if name in FRONT_END_FAMILIES}  # fmt: skip
            self._answered[front_end] = max(self._answered.get(front_end, 0), number)
            self._changed.notify_all()

    def refresh(self) -> None:
        """Ask the front ends for snapshots and wait up to ASK_WAIT_S for them."""
        number = next(self._asks)
        asked = self.ask(number)
        with self._changed:
            self._changed.wait_for(lambda: all(
                self._answered.get(fe, 0) >= number or fe in self._gone for fe in asked),
                ASK_WAIT_S)  # fmt: skip

    def gone(self, front_end: int) -> None:
        """Keep what a gone front end counted (not its gauges) in the sums."""
        with self._changed:
            families = self._live.pop(front_end, {})
            self._answered.pop(front_end, None)
            self._gone.add(front_end)
            self._changed.notify_all()
            for name, samples in families.items():
                if name not in self._gauges:
                    retired = self._retired.setdefault(name, {})
                    for sample_name, labels, value in samples:
                        _add(retired, sample_name, labels, value)

    def collect(self) -> Iterator[Metric]:
        self.refresh()
        with self._changed:
            live = [dict(families) for families in self._live.values()]
            retired = {name: dict(sums) for name, sums in self._retired.items()}
        for family in self.registry.collect():
            if family.name not in FRONT_END_FAMILIES:
                yield family
                continue
            sums = dict(retired.get(family.name, {}))
            for sample in family.samples:
                _add(sums, sample.name, sample.labels, sample.value)
            for families in live:
                for sample_name, labels, value in families.get(family.name, ()):
                    _add(sums, sample_name, labels, value)
            merged = Metric(family.name, family.documentation, family.type, family.unit)
            for (sample_name, labels), value in sums.items():
                merged.add_sample(sample_name, dict(labels), value)
            yield merged
