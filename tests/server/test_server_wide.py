"""The whole server's admission counts and metrics page when gRPC runs in front-end processes
(server.front_ends): the learner's counts bound every front end's calls together and a gone
front end's places go back with it; the page sums the front ends' series into the learner's,
and what a gone front end counted stays counted."""

from __future__ import annotations

import threading

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from service.config import Config, with_overrides
from service.errors import InvalidInput
from service.server.metrics import Metrics
from service.server.server_metrics import ServerWide, snapshot
from service.server.shared_admission import AdmissionCounts


def test_the_counts_bound_every_front_end_together() -> None:
    counts = AdmissionCounts(with_overrides(Config(), ["server.max_streams=3"]).server)
    assert [counts.admit(1, "server.max_streams") for _ in range(2)] == [True, True]
    assert counts.admit(2, "server.max_streams")
    assert not counts.admit(2, "server.max_streams") and not counts.admit(3, "server.max_streams")
    assert counts.admit(2, "server.max_control_rpcs")  # each bound apart
    counts.leave(2, "server.max_streams")
    assert counts.admit(3, "server.max_streams")
    counts.gone(1)  # its two places go back
    assert counts.open("server.max_streams") == 1
    assert counts.admit(4, "server.max_streams") and counts.admit(4, "server.max_streams")
    counts.leave(5, "server.max_streams")  # a front end holding nothing gives nothing back
    assert counts.open("server.max_streams") == 3
    with pytest.raises(InvalidInput, match=r"admission\.bound"):
        counts.admit(1, "server.port")


def page(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}  # fmt: skip


def test_the_page_sums_the_front_ends_into_the_learners_series() -> None:
    learner, fronts = Metrics(CollectorRegistry()), [Metrics(CollectorRegistry()) for _ in "ab"]
    learner.steps.inc(5)
    wide = ServerWide(learner.registry)
    served = CollectorRegistry()
    served.register(wide)
    for i, front in enumerate(fronts):
        front.rpc_errors.labels(method="Step", code="INTERNAL").inc(i + 1)
        front.interact_streams.set(2)
        front.interact_request_duration.observe(0.001)
        wide.update(i, snapshot(front.registry))
    samples = page(served)
    assert samples["trident_steps_total", ()] == 5  # the learner's own
    errors = ("trident_rpc_errors_total", (("code", "INTERNAL"), ("method", "Step")))
    assert samples[errors] == 3
    assert samples["trident_interact_streams", ()] == 4
    assert samples["trident_interact_request_duration_seconds_count", ()] == 2
    wide.gone(0)  # its counters stay in the sum, its streams go with it
    samples = page(served)
    assert samples[errors] == 3 and samples["trident_interact_streams", ()] == 2
    assert samples["trident_interact_request_duration_seconds_count", ()] == 2


def test_a_scrape_asks_the_front_ends_first() -> None:
    """A count made just before the scrape is on it: the page asks each front end that is up
    for a snapshot and waits for its answer (here from another thread, as from the handoff's
    reader)."""
    learner, front = Metrics(CollectorRegistry()), Metrics(CollectorRegistry())
    wide = ServerWide(learner.registry)
    served = CollectorRegistry()
    served.register(wide)

    def ask(number: int) -> list[int]:
        answer = threading.Thread(target=wide.update, args=(7, snapshot(front.registry), number))
        answer.start()
        return [7]

    wide.ask = ask
    front.rpc_errors.labels(method="Act", code="UNAVAILABLE").inc()
    key = ("trident_rpc_errors_total", (("code", "UNAVAILABLE"), ("method", "Act")))
    assert page(served)[key] == 1
    front.rpc_errors.labels(method="Act", code="UNAVAILABLE").inc()
    assert page(served)[key] == 2
