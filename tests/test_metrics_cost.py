"""Percentiles, throughput, goodput and saturation QPS on constructed records; cost arithmetic."""

from __future__ import annotations

import math

import pytest

from workbench import names
from workbench.load import cost
from workbench.load import metrics
from workbench.load.loadgen import RequestRecord


def rec(i, latency_s, *, success=True, sent=None, first=None, scheduled=None):
    sent = float(i) * 0.1 if sent is None else sent
    return RequestRecord(
        index=i, phase="load", offered_qps=10.0, scheduled=sent if scheduled is None else scheduled, sent=sent,
        first_result=None if first is None else sent + first, done=sent + latency_s, success=success,
        error=None if success else "boom", prompt_tokens=8, width=4 if success else 0,
    )  # fmt: skip


def test_percentiles_on_known_latencies():
    # latencies 1..100 ms
    recs = [rec(i, (i + 1) / 1000) for i in range(100)]
    m = metrics.summarize_records(recs, offered_qps=10.0, wall_s=10.0, slo_ms=50.0)
    assert m.e2e_p50_ms == pytest.approx(50.5)
    assert m.e2e_p90_ms == pytest.approx(90.1)
    assert m.e2e_p99_ms == pytest.approx(99.01)
    assert m.e2e_mean_ms == pytest.approx(50.5)
    assert m.achieved_qps == pytest.approx(10.0)
    assert m.goodput_qps == pytest.approx(5.0)  # 50 of 100 within 50 ms, over 10 s
    assert m.failures == 0 and m.requests == 100
    assert math.isnan(m.ttft_p50_ms)
    assert metrics.percentile([], 50) != metrics.percentile([], 50)  # NaN


def test_failures_counted_not_in_percentiles():
    recs = [rec(i, 0.010) for i in range(9)] + [rec(9, 5.0, success=False)]
    m = metrics.summarize_records(recs, 10.0, wall_s=1.0, slo_ms=100)
    assert m.failures == 1 and m.requests == 10
    assert m.e2e_p99_ms == pytest.approx(10.0)  # the failure's 5 s is not a latency
    assert m.achieved_qps == pytest.approx(9.0)
    assert not metrics.within_slo(m, 100)  # any failure disqualifies the point


def test_ttft_and_send_lag():
    recs = [rec(i, 0.02, first=0.005, scheduled=i * 0.1 - 0.003) for i in range(10)]
    m = metrics.summarize_records(recs, 10.0, wall_s=1.0)
    assert m.ttft_p50_ms == pytest.approx(5.0) and m.send_lag_p99_ms == pytest.approx(3.0)
    assert math.isnan(m.goodput_qps)  # no SLO given


def point(achieved, p99, failures=0, offered=None):
    return metrics.PointMetrics(
        offered_qps=offered or achieved, achieved_qps=achieved, requests=100, failures=failures, not_sent=0,
        e2e_p50_ms=p99 / 2, e2e_p90_ms=p99 * 0.9, e2e_p99_ms=p99, e2e_mean_ms=p99 / 2, ttft_p50_ms=float("nan"),
        ttft_p99_ms=float("nan"), goodput_qps=achieved, wall_s=10, client_cpu_share=0.1, loop_cpu_share=0.05,
        send_lag_p99_ms=1.0,
    )  # fmt: skip


def test_saturation_is_highest_achieved_rate_inside_slo_without_failures():
    pts = [point(1.0, 50), point(2.0, 80), point(3.9, 99), point(4.0, 90, failures=1), point(5.0, 400)]
    assert metrics.saturation_qps(pts, slo_ms=100) == 3.9
    # non-monotone: a higher achieved rate inside the SLO wins even after a violation
    assert metrics.saturation_qps(pts + [point(4.5, 100)], slo_ms=100) == 4.5
    assert metrics.saturation_qps([point(1.0, 200)], slo_ms=100) is None
    # achieved, not offered: an engine that kept up with only half the offered rate
    assert metrics.saturation_qps([point(3.0, 20, offered=6.0)], slo_ms=100) == 3.0
    assert not metrics.point_holds(point(3.0, 20, offered=6.0), 100)


def test_grid_bracket_is_the_highest_held_and_the_lowest_broken_offered_rate_above_it():
    # a grid 1, 2, 4 (broke), then its midpoint 2.83 (held): the sweep ended between 2.83 and 4 offered
    grid = [point(1.0, 50), point(2.0, 60), point(3.1, 150, offered=4.0), point(2.8, 70, offered=2.83)]
    assert metrics.grid_bracket(grid, slo_ms=100) == (2.83, 4.0)
    # a broken rate below a held one (noise) bounds nothing; the lowest broken rate above does
    noisy = [point(1.0, 150), point(2.0, 60), point(7.0, 300, offered=8.0), point(3.5, 120, offered=4.0)]
    assert metrics.grid_bracket(noisy, slo_ms=100) == (2.0, 4.0)
    # a failure, or an engine inside the SLO that fell behind its offered rate, breaks a point
    assert metrics.grid_bracket([point(1.0, 50), point(2.0, 60, failures=1)], slo_ms=100) == (1.0, 2.0)
    assert metrics.grid_bracket([point(1.0, 50), point(3.0, 20, offered=6.0)], slo_ms=100) == (1.0, 6.0)
    # the saturation QPS is achieved, the bracket offered: more requests arriving than offered put it above both
    lucky = [point(1.0, 50), point(2.9, 90, offered=2.6), point(2.6, 150, offered=2.8)]
    assert metrics.saturation_qps(lucky, slo_ms=100) == 2.9 and metrics.grid_bracket(lucky, slo_ms=100) == (2.6, 2.8)
    # every point held: no bound above; none held: none below
    assert metrics.grid_bracket([point(1.0, 50), point(2.0, 60)], slo_ms=100) == (2.0, None)
    assert metrics.grid_bracket([point(1.0, 200), point(0.5, 150)], slo_ms=100) == (None, 0.5)


def test_default_slo_and_metric_names():
    assert metrics.default_slo_ms(20.0) == 100.0
    with pytest.raises(ValueError, match="load.slo_ms"):
        metrics.default_slo_ms(float("nan"))
    d = point(1.0, 50).as_metrics()
    assert d[names.E2E_P99] == 50 and d[names.THROUGHPUT] == 1.0 and names.GOODPUT in d


def test_cost_arithmetic():
    # $3.60/h at 1 req/s: 3600 requests per $3.60 -> $1000 per 1M
    assert cost.usd_per_million(3.6, 1.0) == pytest.approx(1000.0)
    assert cost.usd_per_million(0.10, 10.0) == pytest.approx(0.10 / 36000 * 1e6)
    assert cost.usd_per_million(1.0, None) == math.inf
    assert cost.usd_per_million(1.0, 0.0) == math.inf
    with pytest.raises(ValueError):
        cost.usd_per_million(0.0, 1.0)
    # 2.17x the reference's saturation -> 54% cheaper (the reference study's number)
    ref = cost.usd_per_million(1.0, 10.0)
    fast = cost.usd_per_million(1.0, 21.7)
    assert cost.relative_cost(fast, ref) == pytest.approx(-0.539, abs=1e-3)
    assert math.isnan(cost.relative_cost(math.inf, ref))
    row = cost.CostRow.of("torch", "cpu-2core", 0.1, 5.0, reference_usd_per_1m=ref * 0.1)
    assert row.usd_per_1m == pytest.approx(0.1 / 18000 * 1e6) and row.relative_to_reference == pytest.approx(1.0)
