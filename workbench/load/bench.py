"""`workbench bench FILE`: load sweeps per (checkpoint x engine), saturation QPS and cost, in MLflow.

One parent MLflow run per sweep; one child run per (engine x method x workload), tagged with
checkpoint, engine, mode, dtype and workload (names.TAG_*) so that comparisons only ever join
like with like. Each child:

1. opens its engine: in-process through `engines.registry.create_engine`, or over HTTP (an external
   engine started by `engines.remote.launcher`, the workbench's own engines behind `workbench serve`, or an
   already running server at `url`);
2. sends warm-up requests (excluded), then `unloaded_requests` one at a time (the unloaded p50);
3. runs the rate points (a fixed grid or the adaptive geometric grid of `loadgen.py`), logging each
   point's metrics as MLflow steps (step = point number, `load/offered_qps` says which rate);
4. logs its per-request records, its figure, the saturation QPS (`metrics.py`) and the cost (`cost.py`).

The SLO is the config's `load.slo_ms`, or `load.slo_multiple` (5) x the unloaded p50 of the
reference engine (`cost.reference_engine`, measured first; the first engine if it is not in the
sweep) on the first checkpoint; the whole sweep uses one SLO, stated in every run. The relative
cost of each engine is against the reference engine on the same checkpoint; with `cost.reference_method`
(personalization sweeps) each checkpoint's cost is also compared with that method's checkpoint on the
same engine, which is then measured first.

A child that fails (engine not installed, server did not start, engine gone mid-sweep: a rate point
where every request failed without a timeout) is logged as a FAILED run with its reason and the
points it had, and the sweep goes on; the last line printed is one JSON document with the results.
Server logs are kept as artifacts of the parent run and the temporary folder is removed, on success,
failure and interrupt alike.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

from workbench import names
from workbench.config import ConfigError, EngineEntry, LoadConfig, SweepConfig, settings_from
from workbench.load.cost import relative_cost, usd_per_million
from workbench.load.sources import StudySource, resolve_checkpoint
from workbench.sync import run_sync
from workbench.load.loadgen import TIMEOUT_ERROR, SweepSettings, measure_unloaded, records_table, run_sweep, warm_up
from workbench.load.metrics import (
    SLO_MS, UNLOADED_P50, UNLOADED_P99, PointMetrics, default_slo_ms, grid_bracket, percentile, points_table,
    saturation_qps, summarize_point,
)  # fmt: skip

INPROCESS_ENGINES = ("torch", "hf")  # engines `workbench serve` can front


class EngineDown(RuntimeError):
    """Every request of a rate point failed and none ran out of time: the engine is gone or refuses
    everything, so no later rate can tell anything; the child ends FAILED with the points it had."""


@dataclass
class ChildResult:
    """One (engine x checkpoint x workload) sweep, as logged to its child run."""

    series: str  # label in tables and figures
    engine: str
    method: str
    checkpoint: str
    workload: str
    mode: str
    dtype: str
    transport: str
    run_id: str | None = None
    unloaded_p50_ms: float = float("nan")
    points: list[PointMetrics] = field(default_factory=list)
    saturation_qps: float | None = None
    # the offered rates the grid ended between (metrics.grid_bracket): held, and broke above it (None: no such point)
    grid_held_qps: float | None = None
    grid_broke_qps: float | None = None
    usd_per_1m: float = float("inf")
    relative_cost: float = float("nan")
    relative_cost_method: float = float("nan")  # vs cost.reference_method's checkpoint, same engine
    client_cpu_share_max: float = float("nan")
    # the method x engine matrix (load/matrix.py; load.quality_users): quality sample, agreement, serial capacity
    matrix: dict[str, float] = field(default_factory=dict)
    features: str = ""  # the features the method needs and how they ran here
    error: str | None = None

    def row(self) -> dict:
        from workbench.load.matrix import COLUMNS

        d = {k: v for k, v in asdict(self).items() if k not in ("points", "matrix")}
        d["points"] = len(self.points)
        d.update({col: self.matrix.get(key, float("nan")) for key, col in COLUMNS.items()})
        return d


@dataclass
class BenchResult:
    experiment: str
    parent_run_id: str
    slo_ms: float
    slo_source: str
    children: list[ChildResult]

    def summary(self):
        import pandas as pd

        return pd.DataFrame([c.row() for c in self.children])

    def points(self):
        import pandas as pd

        frames = []
        for c in self.children:
            if c.points:
                df = points_table(c.points)
                df.insert(0, "series", c.series)
                df.insert(1, "engine", c.engine)
                df.insert(2, "method", c.method)
                frames.append(df)
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    def to_json(self) -> dict:
        return {
            "experiment": self.experiment, "parent_run_id": self.parent_run_id, "slo_ms": self.slo_ms,
            "slo_source": self.slo_source,
            "results": [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in c.row().items()}
                        for c in self.children],
        }  # fmt: skip


# ---- engines ------------------------------------------------------------------------------------------


def _transport(entry: EngineEntry) -> str:
    if entry.url:
        return "http"
    if entry.transport != "auto":
        return entry.transport
    return "inprocess" if entry.name in INPROCESS_ENGINES else "http"


def _http_client(name: str, url: str, options: dict):
    """The client of a `workbench serve` server (torch or hf engine behind HTTP)."""
    from workbench.engines.remote.http_engine import HTTPEngine

    return HTTPEngine(base_url=url, name=f"{name}-http", **options)


@contextlib.contextmanager
def open_engine(entry: EngineEntry, checkpoint: Path, log_dir: Path | None = None,
                engine_factory=None) -> Iterator[Any]:
    """The engine of `entry` on `checkpoint`; servers this opens are always stopped on exit.

    `engine_factory(entry, checkpoint) -> Engine`, when given, replaces the lookup (bring your own engine).
    """
    from workbench.engines.registry import create_engine

    if engine_factory is not None:
        yield engine_factory(entry, checkpoint)
        return
    transport = _transport(entry)
    options = dict(entry.options)
    if transport == "inprocess":
        if entry.name not in INPROCESS_ENGINES:
            raise ConfigError(f"engine {entry.name!r} runs only behind its own server; use transport: http")
        if entry.threads:
            import torch

            torch.set_num_threads(entry.threads)
        yield create_engine(entry.name, checkpoint=checkpoint, dtype=entry.dtype, **options)
        return
    if entry.name not in INPROCESS_ENGINES:
        # external engines: the adapter talks HTTP to `url`, or launches its own server (engines/remote/launcher.py)
        # and stops it on close()
        if entry.threads and entry.name == "vllm" and not entry.url:
            bind = "0" if entry.threads == 1 else f"0-{entry.threads - 1}"
            options["server_options"] = {"threads_bind": bind, **options.get("server_options", {})}
        yield create_engine(entry.name, checkpoint=checkpoint, dtype=entry.dtype, url=entry.url, **options)
        return
    if entry.url:
        yield _http_client(entry.name, entry.url, options)
        return
    from workbench.engines.remote import launcher

    # the torch engine's variants are server options (its command line); the rest configure the HTTP client
    from workbench.engines.torch.options import VARIANT_OPTIONS

    variant = {k: options.pop(k) for k in VARIANT_OPTIONS if k in options}
    spec = launcher.workbench_serve_spec(checkpoint, entry.name, entry.dtype, threads=entry.threads, **variant)
    log = None if log_dir is None else log_dir / f"{entry.label or entry.name}-server.log"
    with launcher.launch(spec, log_path=log) as server:
        print(f"[bench] workbench serve ({entry.name}) up at {server.url} after {server.started_s:.1f} s",
              file=sys.stderr)
        yield _http_client(entry.name, server.url, options)


def _mode(load: LoadConfig, caps) -> str:
    """The mode tag: how the feature the workload needs ran on this engine."""
    from workbench.engines.base import Support

    if load.workload == "scoring":
        st = caps.features["multi_item_scoring"].status
        return "one_pass" if st == Support.NATIVE else "fanout"
    if not load.constrained:
        return "unconstrained"
    return "emulated" if caps.features["trie_constraint"].status == Support.EMULATED else "constrained"


# ---- the sweep ----------------------------------------------------------------------------------------


def sweep_settings(load: LoadConfig) -> SweepSettings:
    return settings_from(SweepSettings, load, progress=sys.stderr.isatty())


def make_workload(load: LoadConfig, checkpoint: Path, study: StudySource | None = None):
    """Synthetic prompts of `load.prompt_tokens`, or (prompts_from: test_split) the checkpoint's real test prompts."""
    from workbench.engines.workloads import SyntheticWorkload, TestSplitWorkload, WorkloadShape

    kind = "scoring" if load.workload == "scoring" else "beam_search"
    shape = WorkloadShape(kind=kind, prompt_tokens=load.prompt_tokens, beam_width=load.beam_width,
                          max_new_tokens=load.max_new_tokens, constrained=load.constrained, candidates=load.candidates,
                          candidate_tokens=load.candidate_tokens, seed=load.seed)  # fmt: skip
    if load.prompts_from == "test_split":  # LoadConfig guarantees load.study is set
        try:
            return TestSplitWorkload.from_prompt_set(shape, checkpoint, study.test_prompts(checkpoint))
        except ValueError as e:
            raise ConfigError(f"load.prompts_from: test_split on {checkpoint}: {e}") from None
    return SyntheticWorkload.from_checkpoint(shape, checkpoint)


class _SLO:
    """The sweep's one SLO: from the config, or fixed by the first unloaded measurement (the reference's)."""

    def __init__(self, load: LoadConfig):
        self.multiple = load.slo_multiple
        self.ms: float | None = load.slo_ms
        self.source = "config (load.slo_ms)" if load.slo_ms is not None else ""

    def resolve(self, series: str, unloaded_p50_ms: float) -> float:
        if self.ms is None:
            self.ms = default_slo_ms(unloaded_p50_ms, self.multiple)
            self.source = f"{self.multiple:g}x unloaded p50 of {series} ({unloaded_p50_ms:.2f} ms)"
        return self.ms


async def _measure(engine, workload, settings: SweepSettings, slo: _SLO, child: ChildResult, handle) -> list:
    idx = 0
    warm = await warm_up(engine, workload, settings.warmup_requests, first_index=idx,
                         timeout_s=settings.request_timeout_s)
    idx += settings.warmup_requests
    unloaded = await measure_unloaded(engine, workload, settings.unloaded_requests, first_index=idx,
                                      timeout_s=settings.request_timeout_s)  # fmt: skip
    idx += settings.unloaded_requests
    ok = [(r.done - r.sent) * 1e3 for r in unloaded if r.success]
    if not ok:
        errors = sorted({r.error for r in unloaded if r.error})[:3]
        raise RuntimeError(f"every unloaded request to {child.series} failed: {errors}")
    child.unloaded_p50_ms = percentile(ok, 50)
    slo_ms = slo.resolve(child.series, child.unloaded_p50_ms)
    handle.log_metrics({UNLOADED_P50: child.unloaded_p50_ms, UNLOADED_P99: percentile(ok, 99), SLO_MS: slo_ms})
    handle.set_tags({names.TAG_SLO_SOURCE: slo.source})

    def on_point(i: int, point) -> None:
        m = summarize_point(point, slo_ms)
        child.points.append(m)
        handle.log_metrics(m.as_metrics(), step=i)
        held = "inside" if m.failures == 0 and m.e2e_p99_ms <= slo_ms else "OUTSIDE"
        print(f"[bench] {child.series}: offered {m.offered_qps:7.3f} achieved {m.achieved_qps:7.3f} req/s  "
              f"p50 {m.e2e_p50_ms:8.1f}  p99 {m.e2e_p99_ms:8.1f} ms  failures {m.failures}  ({held} SLO "
              f"{slo_ms:.0f} ms; client loop CPU {m.loop_cpu_share:.0%})", file=sys.stderr)  # fmt: skip
        errors = [r.error or "" for r in point.records if not r.success]
        if m.requests and len(errors) == m.requests and not any(e.startswith(TIMEOUT_ERROR) for e in errors):
            raise EngineDown(f"every request at {m.offered_qps:g} req/s failed (engine down or refusing all): "
                             f"{sorted(set(errors))[:3]}")

    # first adaptive rate: a fraction of the serial capacity 1/p50
    first_rate = settings.start_load * 1e3 / child.unloaded_p50_ms
    points = await run_sweep(engine, workload, settings, slo_ms=slo_ms, first_rate=first_rate, first_index=idx,
                             on_point=on_point)  # fmt: skip
    return warm + unloaded + [r for p in points for r in p.records]


async def _run_engine(entry: EngineEntry, checkpoint: Path, workload, settings, slo, child, handle, load, log_dir,
                      engine_factory=None, study: StudySource | None = None, references: dict | None = None):
    with open_engine(entry, checkpoint, log_dir, engine_factory) as engine:
        try:
            if callable(getattr(engine, "fetch_capabilities", None)):  # HTTP clients ask their server
                await engine.fetch_capabilities()
            caps = engine.capabilities()
            child.mode = _mode(load, caps)
            handle.set_tags({names.TAG_MODE: child.mode})
            handle.log_dict({f: {"status": s.status.value, "reason": s.reason} for f, s in caps.features.items()},
                            "capabilities.json")  # fmt: skip
            if load.quality_users:  # the matrix's cell: quality through this engine before its load points
                from workbench.load.matrix import run_cell

                metrics, child.features = await run_cell(engine, caps, checkpoint, load,
                                                         study.test_prompts(checkpoint), entry.name == "torch",
                                                         references, entry.dtype)
                child.matrix.update(metrics)
                handle.log_metrics(metrics)
                handle.set_tags({names.TAG_FEATURES: child.features})
                print(f"[bench] {child.series} / {child.method}: quality sample NDCG@10 "
                      f"{metrics[names.MATRIX_NDCG]:.4f} [{metrics[names.MATRIX_NDCG_LO]:.4f}, "
                      f"{metrics[names.MATRIX_NDCG_HI]:.4f}] on {metrics[names.MATRIX_USERS]:.0f} users; identical "
                      f"top-10 vs torch {metrics.get(names.MATRIX_AGREE, float('nan')):.1%} (differing beyond the "
                      f"rounding bound: {metrics.get(names.MATRIX_BEYOND_BOUND, float('nan')):.0f}); {child.features}",
                      file=sys.stderr)  # fmt: skip
            return await _measure(engine, workload, settings, slo, child, handle)
        finally:
            await engine.close()


def _dataset(study: StudySource | None) -> str:
    """The dataset tag of a sweep's runs: the study's (trained checkpoints, test prompts), else synthetic."""
    return study.cfg.dataset.name if study else "synthetic"


def _child(parent, cfg: SweepConfig, entry: EngineEntry, checkpoint: Path, slo: _SLO, settings: SweepSettings,
           reference_cost: dict[str, float], log_dir: Path, engine_factory=None,
           study: StudySource | None = None, method_cost: dict[str, float] | None = None,
           references: dict | None = None) -> ChildResult:
    from workbench.model.checkpoint import read_meta
    from workbench.load.plots import latency_vs_qps
    from workbench.tracking import start_run

    from workbench.hardware import resolve_dtype

    load = cfg.load
    requested = entry.dtype
    # "auto" made concrete (for the engine's device option, where it has one)
    entry = entry.model_copy(update={"dtype": resolve_dtype(entry.dtype, entry.name, entry.options.get("device"))})
    meta = read_meta(checkpoint)
    workload = make_workload(load, checkpoint, study)
    series = entry.label or entry.name
    child = ChildResult(series=series, engine=entry.name, method=meta.method, checkpoint=str(checkpoint),
                        workload=workload.name, mode="", dtype=entry.dtype, transport=_transport(entry))  # fmt: skip
    tags = {
        names.TAG_STAGE: names.STAGE_LOAD, names.TAG_ENGINE: entry.name, names.TAG_METHOD: meta.method,
        names.TAG_CHECKPOINT: str(checkpoint), names.TAG_DTYPE: entry.dtype, names.TAG_WORKLOAD: workload.name,
        names.TAG_DATASET: _dataset(study), names.TAG_SERIES: series, names.TAG_TRANSPORT: child.transport,
        names.TAG_SID_VERSION: meta.sid_version, names.TAG_BACKBONE: meta.backbone,
        names.TAG_PROMPTS_FROM: load.prompts_from,
    }  # fmt: skip
    run_name = f"{series}/{meta.method}/{workload.name}"
    try:
        with start_run(run_name, parent=parent, tags=tags) as h:
            child.run_id = h.run_id
            h.log_params({"engine": entry.model_dump(mode="json"), "dtype_requested": requested,
                          "load": load.model_dump(mode="json"),
                          "cost": cfg.cost.model_dump(mode="json"), "checkpoint": str(checkpoint)})  # fmt: skip
            if hasattr(workload, "prompt_tokens_mean"):  # real prompts: their measured length
                h.log_metrics({names.PROMPT_TOKENS_MEAN: workload.prompt_tokens_mean})
            try:
                records = run_sync(_run_engine(entry, checkpoint, workload, settings, slo, child, h, load, log_dir,
                                                engine_factory, study, references))
            except BaseException:  # failed or interrupted: the run keeps the points it had (its metrics are logged)
                if child.points:
                    with contextlib.suppress(Exception):
                        h.log_table(points_table(child.points), "points.csv")
                raise
            h.log_table(records_table(records), "records.csv")
            h.log_table(points_table(child.points), "points.csv")
            child.saturation_qps = saturation_qps(child.points, slo.ms)
            child.grid_held_qps, child.grid_broke_qps = grid_bracket(child.points, slo.ms)
            child.usd_per_1m = usd_per_million(cfg.cost.usd_per_hour, child.saturation_qps)
            child.relative_cost = _against(reference_cost, str(checkpoint), entry.name == cfg.cost.reference_engine,
                                           child.usd_per_1m)
            if method_cost is not None and cfg.cost.reference_method is not None:
                child.relative_cost_method = _against(method_cost, series, meta.method == cfg.cost.reference_method,
                                                      child.usd_per_1m)
            child.client_cpu_share_max = max((p.client_cpu_share for p in child.points), default=float("nan"))
            from workbench.load.matrix import serial_capacity

            serial = serial_capacity(child.unloaded_p50_ms, cfg.cost.usd_per_hour, child.points)
            child.matrix.update(serial)
            h.log_metrics({**serial,
                names.SATURATION_QPS: child.saturation_qps if child.saturation_qps is not None else 0.0,
                **{k: v for k, v in ((names.GRID_HELD, child.grid_held_qps), (names.GRID_BROKE, child.grid_broke_qps))
                   if v is not None},
                names.COST_PER_1M: child.usd_per_1m, names.COST_RELATIVE: child.relative_cost,
                names.COST_RELATIVE_METHOD: child.relative_cost_method,
                "load/client_cpu_share_max": child.client_cpu_share_max,
                "load/client_loop_cpu_share_max": max((p.loop_cpu_share for p in child.points), default=float("nan")),
            })  # fmt: skip
            h.set_tags({names.TAG_SATURATED: str(child.saturation_qps is not None)})
            pts = points_table(child.points)
            pts.insert(0, "series", series)
            h.log_figure(latency_vs_qps(pts, slo.ms, title=f"{run_name}: latency vs QPS"), "latency_vs_qps.html")
    except Exception as e:  # noqa: BLE001 - one engine failing must not end the sweep; the run says why
        child.error = f"{type(e).__name__}: {e}"[:2000]
        print(f"[bench] {series} on {checkpoint.name}: FAILED: {child.error}", file=sys.stderr)
    return child


def _against(references: dict[str, float], key: str, is_reference: bool, usd_per_1m: float) -> float:
    """Relative cost vs the reference measured for `key` (the first reference run records itself); NaN if none."""
    if is_reference and key not in references:
        references[key] = usd_per_1m
    ref = references.get(key)
    return float("nan") if ref is None else relative_cost(usd_per_1m, ref)


def _ordered_engines(cfg: SweepConfig) -> list[EngineEntry]:
    """The reference engine first, so its unloaded p50 fixes the SLO and its cost the relative costs."""
    ref = cfg.cost.reference_engine
    return sorted(cfg.engines, key=lambda e: e.name != ref)


def _ordered_checkpoints(cfg: SweepConfig, checkpoints: list[Path]) -> list[Path]:
    """The `cost.reference_method` checkpoint first, so its cost is known when the others are measured."""
    ref = cfg.cost.reference_method
    if ref is None:
        return checkpoints
    from workbench.model.checkpoint import read_meta

    methods = [read_meta(c).method for c in checkpoints]
    if ref not in methods:
        print(f"[bench] cost.reference_method {ref!r}: no checkpoint of this sweep is that method ({methods}); "
              "relative costs by method will be empty", file=sys.stderr)  # fmt: skip
    return [c for _, c in sorted(zip(methods, checkpoints), key=lambda mc: mc[0] != ref)]


@contextlib.contextmanager
def _server_logs(parent) -> Iterator[Path]:
    """A temporary folder for the servers' logs; on the way out (success, failure, interrupt) the logs
    become artifacts of `parent` (`server_logs/`) and the folder is removed."""
    import shutil
    import tempfile

    log_dir = Path(tempfile.mkdtemp(prefix="workbench-bench-"))
    try:
        yield log_dir
    finally:
        try:
            for f in sorted(log_dir.glob("*.log")):
                with contextlib.suppress(Exception):
                    parent.log_artifact(f, "server_logs")
        finally:
            shutil.rmtree(log_dir, ignore_errors=True)


def run_bench(cfg: SweepConfig, experiment_file: str | Path | None = None, *, engine_factory=None,
              progress: bool | None = None) -> BenchResult:
    """Run the sweep of `cfg.load` for every checkpoint x engine; log it all; return the results.

    `engine_factory(entry, checkpoint) -> Engine` replaces the registry lookup (tests, custom engines);
    `progress` reports each rate point (workbench.progress: a bar on a terminal, lines elsewhere;
    default: when stderr is a terminal). Runs go to `cfg.tracking.uri` when set (a team server), else
    to the store the environment selects (`tracking.use`, entered once here for the CLI and notebooks).
    """
    from workbench import tracking

    with tracking.use(cfg.tracking.uri):
        return _run_tracked(cfg, experiment_file, engine_factory, progress)


def _run_tracked(cfg: SweepConfig, experiment_file: str | Path | None, engine_factory, progress: bool | None
                 ) -> BenchResult:
    from workbench.load.plots import cost_bars, latency_vs_qps, throughput_vs_offered
    from workbench.tracking import start_run, ui_hint

    load = cfg.load
    experiment = cfg.experiment_name
    study = StudySource(load.study, load.study_seed) if load.study else None
    checkpoints = _ordered_checkpoints(cfg, [resolve_checkpoint(s, load, study) for s in load.checkpoints])
    settings = sweep_settings(load)
    if progress is not None:
        settings.progress = progress
    slo = _SLO(load)
    reference_cost: dict[str, float] = {}
    method_cost: dict[str, float] = {}  # per engine series: the reference method's $ per 1M
    references: dict = {}  # per checkpoint: the torch cell's quality sample (load.quality_users)
    children: list[ChildResult] = []
    ptags = {names.TAG_STAGE: names.STAGE_LOAD_SWEEP, names.TAG_WORKLOAD: load.workload, names.TAG_DATASET: _dataset(study)}
    with start_run(f"{cfg.name}/{load.workload}", experiment=experiment, config=cfg, experiment_file=experiment_file,
                   tags=ptags) as parent, _server_logs(parent) as log_dir:  # fmt: skip
        for ckpt in checkpoints:
            for entry in _ordered_engines(cfg):
                children.append(_child(parent, cfg, entry, ckpt, slo, settings, reference_cost, log_dir,
                                       engine_factory, study, method_cost, references))
        result = BenchResult(experiment, parent.run_id, slo.ms if slo.ms is not None else float("nan"), slo.source,
                             children)  # fmt: skip
        parent.set_tags({names.TAG_SLO_SOURCE: slo.source})
        parent.log_metrics({SLO_MS: result.slo_ms})
        summary = result.summary()
        parent.log_table(summary, "summary.csv")
        pts = result.points()
        if len(pts):
            parent.log_table(pts, "points.csv")
            parent.log_figure(latency_vs_qps(pts, result.slo_ms), "latency_vs_qps.html")
            parent.log_figure(throughput_vs_offered(pts), "throughput_vs_offered.html")
            parent.log_figure(cost_bars(summary), "cost_per_1m.html")
        if load.quality_users:
            from workbench.load.matrix import FIGURES, matrix_figures, matrix_table

            table = matrix_table(summary)
            parent.log_table(table, "matrix.csv")
            for title, fig in matrix_figures(table).items():
                parent.log_figure(fig, FIGURES[title])
        parent.log_dict(result.to_json(), "bench_result.json")
    _print_summary(result, cfg)
    print(ui_hint(result.parent_run_id), file=sys.stderr)
    print(json.dumps(result.to_json()))
    return result


def _print_summary(result: BenchResult, cfg: SweepConfig) -> None:
    print(f"\n[bench] SLO {result.slo_ms:.1f} ms ({result.slo_source}); price ${cfg.cost.usd_per_hour}/h "
          f"({cfg.cost.hardware})", file=sys.stderr)  # fmt: skip
    for c in result.children:
        if c.error:
            print(f"  {c.series:12s} {c.method:12s} FAILED: {c.error[:160]}", file=sys.stderr)
            continue
        sat = "none inside SLO" if c.saturation_qps is None else f"{c.saturation_qps:.3f} req/s"
        held = "none" if c.grid_held_qps is None else f"{c.grid_held_qps:.3g}"
        broke = "none" if c.grid_broke_qps is None else f"{c.grid_broke_qps:.3g}"
        sat += f" (offered: held {held}, broke {broke})"
        rel = "" if not math.isfinite(c.relative_cost) else f" ({c.relative_cost:+.0%} vs {cfg.cost.reference_engine})"
        if math.isfinite(c.relative_cost_method):
            rel += f" ({c.relative_cost_method:+.0%} vs {cfg.cost.reference_method})"
        print(f"  {c.series:12s} {c.method:12s} unloaded p50 {c.unloaded_p50_ms:8.1f} ms  saturation {sat:>16s}  "
              f"${c.usd_per_1m:.4g} per 1M{rel}", file=sys.stderr)  # fmt: skip
