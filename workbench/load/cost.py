"""Cost per million requests from the saturation QPS and an hourly hardware price.

    $ per 1M requests = usd_per_hour / (saturation_qps * 3600) * 1e6

The hourly price comes from the config's `cost` section (user-editable, logged with every run), so
the number is only as good as that price; the relative cost against a reference engine on the same
hardware does not depend on it (the reference study's "-54%" is `relative_cost(...)` = -0.54).
An engine with no saturation QPS (no rate point inside the SLO) has an infinite cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def usd_per_million(usd_per_hour: float, saturation_qps: float | None) -> float:
    """Dollars per 1M requests at full use of hardware priced `usd_per_hour`; inf without a saturation rate."""
    if not usd_per_hour > 0:
        raise ValueError(f"usd_per_hour must be > 0, got {usd_per_hour}")
    if saturation_qps is None or not saturation_qps > 0 or not math.isfinite(saturation_qps):
        return float("inf")
    return usd_per_hour / (saturation_qps * 3600.0) * 1e6


def relative_cost(cost: float, reference_cost: float) -> float:
    """cost / reference - 1: -0.54 means 54% cheaper than the reference; NaN when undefined."""
    if not (math.isfinite(cost) and math.isfinite(reference_cost)) or reference_cost <= 0:
        return float("nan")
    return cost / reference_cost - 1.0


@dataclass(frozen=True)
class CostRow:
    """One engine's cost line, as logged and tabulated."""

    engine: str
    hardware: str
    usd_per_hour: float
    saturation_qps: float | None
    usd_per_1m: float
    relative_to_reference: float  # NaN for the reference itself when it has no cost

    @classmethod
    def of(cls, engine: str, hardware: str, usd_per_hour: float, saturation_qps: float | None,
           reference_usd_per_1m: float | None = None) -> "CostRow":
        c = usd_per_million(usd_per_hour, saturation_qps)
        rel = float("nan") if reference_usd_per_1m is None else relative_cost(c, reference_usd_per_1m)
        return cls(engine, hardware, usd_per_hour, saturation_qps, c, rel)
