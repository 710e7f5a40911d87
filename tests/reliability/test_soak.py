"""The CI-fast soak: bench/soak.py's own run with 4 actors for 40 s (`make soak` runs 16 for
10 minutes). One run per module; each criterion is its own test: no errors (no rollout dropped
at the server's default Step queue and policy lag), every rollout the actors saw trained counted
by the server, the server's RSS flat after the warm-up, `promtool check metrics` clean, latency
recorded by every actor."""

from __future__ import annotations

from typing import Any

import pytest
from deploy.tools import find_binary, require_binary

from bench.soak import Settings, failures, soak

pytestmark = pytest.mark.slow

SETTINGS = Settings(
    actors=4,
    duration_s=40.0,
    num_envs=8,  # 128 samples a Step: the replay fills within the warm-up on a busy 2-core box
    replay_capacity=1024,
    step_key_window=16,  # the ledger of applied keys is full within the warm-up as well
    warmup_frac=0.5,  # the actors' start-up, then the allocators settling (RSS rises for ~15 s)
)
# The line through 20 s of RSS samples, extrapolated to 10 minutes, multiplies the RSS's
# ordinary wander (~0.5 MiB of ~75 MiB while allocator pools settle) by 30: the short run bounds
# the line's change over its own span instead. 2 % of ~75 MiB is 1.5 MiB over the ~40 Steps of
# that span: a leak of the order of one rollout per Step (request bytes, decoded arrays and
# replay transitions, ~100 KiB at 16x8) would cross it. The first 20 s are left out: over a
# 20 s run with 12 s measured, the settling itself came to 2.0-2.4 % on the 2-vCPU VM (the
# bound failed at 1ce58ff 4 times in 4 and in a clean-clone CI run); from 20 s on, -0.1-0.6 %.
MAX_RSS_CHANGE_PCT = 2.0


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return soak(SETTINGS, tmp_path_factory.mktemp("soak"), find_binary("promtool"))


def test_no_errors(report: dict[str, Any]) -> None:
    assert "errors" not in failures(report), report["results"]


def test_every_step_is_counted_by_the_server(report: dict[str, Any]) -> None:
    assert "steps" not in failures(report), report["summary"]
    metrics, summary = report["results"]["metrics"], report["summary"]
    assert metrics["rollouts_dropped_total"] == 0
    assert metrics["rollouts_total"] == summary["rollouts_sent"] == summary["rollouts_trained"]
    assert metrics["global_step"] == metrics["steps_total"]
    assert report["results"]["server"]["steps_logged"] == metrics["steps_total"]


def test_server_rss_is_flat_after_the_warm_up(report: dict[str, Any]) -> None:
    rss = report["results"]["rss"]
    assert "error" not in rss, rss
    assert abs(rss["change_pct"]) < MAX_RSS_CHANGE_PCT, rss


def test_every_actor_records_step_and_act_latency(report: dict[str, Any]) -> None:
    actors = [actor["done"] for actor in report["results"]["actors"]]
    assert all(done is not None for done in actors), report["results"]["actors"]
    for done in actors:
        assert done["acts"] == SETTINGS.rollout_len * done["rollouts"]
        assert done["rollouts"] == done["sent"] + done["dropped"] and not done["resent"]
        assert 0 < done["step_p50"] <= done["step_p99"] and 0 < done["act_p50"] <= done["act_p99"]
    metrics = report["results"]["metrics"]
    step = metrics["step_engine"]
    assert step["count"] == metrics["steps_total"] and step["p99_ms"] is not None


def test_promtool_finds_no_problem_in_the_scrape(report: dict[str, Any]) -> None:
    require_binary("promtool", "install Debian's prometheus package")
    assert "promtool" not in failures(report), report["results"]["promtool"]
