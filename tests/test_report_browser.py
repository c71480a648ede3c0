"""Every kind of report, opened in a real browser: a study, a load sweep, and the two joined.

The experiments are tiny real runs in a temporary MLflow store: the shared tiny study
(`workbench.testing.TINY_STUDY_OVERRIDES`, trained and evaluated through the pipeline, with the
user-signal ablation), two sweeps of the torch engine that differ only in dtype (the report must
draw them as two series), a sweep of the study's own trained checkpoints (its quality joins
them: the quality-vs-cost front), and two performance runs (`workbench microbench --floor` and
`--ab`). Each report is opened in headless Chromium (Debian's `/usr/bin/chromium`, driven by
Playwright through `workbench.report.picture`, the helper `workbench report --png` uses; no browser
is downloaded) and checked from the DOM: plotly loaded, every figure has traces and every trace drew
SVG marks, lines join their points along the x axis, tables stay inside the page, no console error.
A full-page screenshot of each is saved under the test's tmp folder and its path printed, and the
README's picture (`--png`) is taken of one and checked small. Without Chromium or Playwright the
browser checks skip and say why; the content checks still run.
"""

from __future__ import annotations

import contextlib
import html
import importlib.util
import io
import math
import struct
import time
from pathlib import Path

import pytest
import yaml

from workbench import names

pytestmark = pytest.mark.timeout(300)
KINDS = {"study": "browser_study", "load": "browser_load", "join": "browser_study,browser_study_load",
         "perf": "browser_perf"}
STUDY_FIGURES = ["study: test quality per method", "study: what the user signal carries",
                 "study: quality vs prompt length", "study: quality vs ms/request", "study: quality by history length",
                 "study: validation NDCG@10 per epoch",
                 "study: validation NDCG@10 vs training FLOPs", "study: SID codebook utilization"]  # fmt: skip


def _tiny_study(tmp: Path) -> Path:
    """experiments/quickstart.yaml with the shared tiny-study overrides (ablation on, and `none` also at 2 items:
    a context variant, so the quality-vs-prompt-length figure draws a line), trained and evaluated."""
    from workbench.config import deep_merge, load_config
    from workbench.paths import REPO_ROOT
    from workbench.study.pipeline import run_experiment
    from workbench.testing import TINY_STUDY_OVERRIDES

    base = yaml.safe_load((REPO_ROOT / "experiments" / "quickstart.yaml").read_text())
    cfg = deep_merge(base, {**TINY_STUDY_OVERRIDES, "name": "browser_study", "split": {"max_history": 50},
                            "tracking": {"experiment": "browser_study"}})  # fmt: skip
    cfg["evaluation"]["signal_ablation"] = True
    cfg["methods"]["contexts"] = {"none": [2]}
    path = tmp / "browser_study.yaml"
    path.write_text(yaml.safe_dump(cfg))
    run_experiment(load_config(path), path)
    return path


def _sweep(name: str, engines: list[dict], load: dict) -> None:
    from workbench.config import parse_config
    from workbench.load.bench import run_bench

    cfg = parse_config({"name": name, "tracking": {"experiment": name}, "engines": engines,
                        "load": {"rates": [3.0, 8.0], "requests_per_rate": 8, "warmup_requests": 1,
                                 "unloaded_requests": 2, "slo_ms": 60000, **load},
                        "cost": {"usd_per_hour": 1.0, "reference_engine": engines[0]["name"]}})  # fmt: skip
    res = run_bench(cfg, progress=False)
    assert [c.error for c in res.children] == [None] * len(res.children)


def _perf_runs(checkpoint: Path) -> None:
    """`workbench microbench --floor --dtype both` and `--ab`, tiny, into the experiment browser_perf."""
    from workbench.perf.microbench import main as microbench_main

    shape = ["--quick", "--threads", "1", "--checkpoint", str(checkpoint), "--prompt-len", "16", "--beam", "4",
             "--new-tokens", "3", "--experiment", "browser_perf"]  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()):
        assert microbench_main(["--floor", "--dtype", "both", *shape]) == 0
        assert microbench_main(["--ab", "gemm=default", "gemm=onednn", *shape]) == 0


@pytest.fixture(scope="module")
def reports(tmp_path_factory, bench_checkpoint, one_torch_thread):
    """{kind: report path}, or {kind: None} where the study could not be built (no MovieLens wheel)."""
    tmp = tmp_path_factory.mktemp("report_browser")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp)
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp / 'mlflow.db'}")
        mp.setenv("WORKBENCH_MLRUNS_DIR", str(tmp / "mlruns"))
        mp.setenv("WORKBENCH_DATA_DIR", str(tmp / "data"))
        from workbench.report.html import collect_study, write_report

        t0 = time.perf_counter()
        beam = {"workload": "beam_search", "checkpoints": [str(bench_checkpoint)], "prompt_tokens": 16,
                "beam_width": 4, "max_new_tokens": 3}  # fmt: skip
        for dtype in ("float32", "bfloat16"):  # the same engine in two dtypes, two sweeps: two series
            _sweep("browser_load", [{"name": "torch", "dtype": dtype}], beam)
        _perf_runs(bench_checkpoint)
        kinds = dict(KINDS)
        if importlib.util.find_spec("recbole") is None:  # MovieLens-100K ships in the recbole wheel
            kinds = {k: KINDS[k] for k in ("load", "perf")}
        else:
            study = _tiny_study(tmp)
            _sweep("browser_study_load", [{"name": "torch"}, {"name": "hf"}],  # also a method x engine matrix
                   {"workload": "personalization", "study": str(study), "prompts_from": "test_split",
                    "checkpoints": ["trained:none", "trained:soft_token"], "beam_width": 10, "max_new_tokens": 3,
                    "constrained": True, "rates": [2.0, 4.0], "quality_users": 8})  # fmt: skip
        out = {k: write_report(e, tmp / "reports" / f"{k}.html") for k, e in kinds.items()}
        print(f"\nbuilt {len(out)} reports from tiny real runs in {time.perf_counter() - t0:.0f}s")
        yield {"paths": out, "studies": {k: collect_study(e.split(",")) for k, e in kinds.items()}, "tmp": tmp}


def _need(reports, kind: str) -> Path:
    if kind not in reports["paths"]:
        pytest.skip("the tiny study needs MovieLens-100K from the recbole wheel: pip install --no-deps recbole==1.2.1")
    return reports["paths"][kind]


# ---- what the pages hold (no browser) ---------------------------------------------------------------


def test_study_report_shows_what_the_study_logged(reports):
    from workbench.report import html as report

    path = _need(reports, "study")
    s = reports["studies"]["study"]
    sr = s.studies
    assert len(sr.runs) == 1 and len(s.summary) == 0
    methods = set(sr.table["method"])
    assert {"popularity", "als", "ease", "sasrec", "none", "soft_token", "soft_token/shuffled",
            "soft_token/zeroed"} <= methods  # fmt: skip
    assert sr.table.set_index("method").loc["soft_token", f"vs_none/{names.ndcg_at(10)}_lo"] <= \
        sr.table.set_index("method").loc["soft_token", f"vs_none/{names.ndcg_at(10)}"]
    assert set(sr.per_seed["method"]) >= {"none", "soft_token", "soft_token/shuffled", "soft_token/zeroed", "sasrec",
                                          "ease"}
    # the table by history length: every row of the table on each quartile, the quartiles partition the test users
    sl = sr.slices
    assert set(sl["method"]) == methods and sl["slice"].str.match(r"Q[1-4] \(").all()
    users = sl.drop_duplicates("slice")["slice_users"]
    assert users.sum() == int(sr.table["test_users"].iloc[0]) and len(users) >= 2
    panels = {t.yaxis for t in report.figures(s)["study: quality by history length"].data}
    assert panels == {"y", "y2"}  # NDCG@10 per quartile above, the difference vs none below
    assert set(sr.curves["method"]) == {"none", "none-k2", "soft_token"} and sr.curves[names.TRAIN_FLOPS].gt(0).all()
    # quality vs prompt length and vs ms/request: a line per method across its contexts (none: 2 and 3 items)
    for title in ("study: quality vs prompt length", "study: quality vs ms/request"):
        lines = {t.name: t for t in report.figures(s)[title].data}
        assert set(lines) == {"none", "soft_token"} and len(lines["none"].x) == 2, title
        assert sorted(lines["none"].text) == ["2 items", "3 items"], title
    assert {"n", "collision_rate", "utilization_l0"} <= set(sr.sid["statistic"])
    run = sr.runs[0]
    assert run["cpu"] and run["commit"] and run["config"]["name"] == "browser_study"
    assert "torch" in run["environment"]["versions"] and "mlflow" in run["environment"]["versions"]
    assert list(report.figures(s)) == STUDY_FIGURES
    text = path.read_text()
    for anchor in ("study-quality", "study-slices", "study-seeds", "study-curves", "study-ablation", "study-cost",
                   "study-sids", "study-runs"):  # fmt: skip
        assert f"id='{anchor}'" in text, anchor
    assert "No finished load runs" not in text and "(none)" not in text
    assert "No table by history length" not in text and html.escape(sl["slice"].iloc[0]) in text
    for col in ("ΔNDCG@10 vs none", "ΔNDCG@10 vs ALS", "ΔNDCG@10 vs EASE", "ΔNDCG@10 vs SASRec",
                "ΔNDCG@10 vs own signal", "ΔNDCG@10 vs none at its context", "prompt tokens (mean)", "train FLOPs",
                "ms/request", "best epoch / run", "collision_rate", run["cpu"]):
        assert col in text, col


def test_load_report_keys_series_by_dtype(reports):
    from workbench.report import html as report

    s = reports["studies"]["load"]
    assert sorted(s.summary["dtype"]) == ["bfloat16", "float32"] and len(s.parents) == 2
    figs = report.figures(s)
    lat = next(f for t, f in figs.items() if t.endswith("latency vs achieved QPS"))
    series = sorted(t.name for t in lat.data if not t.name.startswith("SLO "))
    assert series == ["torch · bfloat16 p50", "torch · bfloat16 p99", "torch · float32 p50", "torch · float32 p99"]
    (slo,) = [t for t in lat.data if t.name.startswith("SLO ")]  # the SLO as a line in data units (load/plots.py)
    assert len(set(slo.y)) == 1 and not lat.layout.shapes
    cost = next(f for t, f in figs.items() if t.endswith("cost per 1M requests"))
    assert sorted(x for t in cost.data for x in t.x) == ["torch · bfloat16", "torch · float32"]


def test_join_report_draws_the_quality_cost_front(reports):
    from workbench.report import html as report

    _need(reports, "join")
    s = reports["studies"]["join"]
    q = s.joined.set_index("engine")[report.default_quality_metric()]
    # the study measured quality through torch: its load runs join it, hf's refuse to (the matrix has hf's own)
    assert q["torch"].notna().all() and q["hf"].isna().all()
    assert len(s.not_joined) == 2 and all("'hf' vs 'torch'" in n for n in s.not_joined)
    figs = report.figures(s)
    assert set(STUDY_FIGURES) <= set(figs) and {"quality vs cost", "quality vs p99 latency"} <= set(figs)
    # the sweep is also a method x engine matrix: one cell per (method, engine), torch agreeing with itself
    m = report.matrix_of(s).set_index(["method", "series"])
    assert sorted(m.index) == [("none", "hf"), ("none", "torch"), ("soft_token", "hf"), ("soft_token", "torch")]
    assert (m.xs("torch", level="series")["agree_top10"] == 1.0).all() and m["agree_top10"].between(0, 1).all()
    assert m["cost_basis"].isin(["saturation within SLO", "serial capacity (no rate within SLO)"]).all()
    assert "id='matrix'" in reports["paths"]["join"].read_text()


# ---- in the browser ---------------------------------------------------------------------------------

# Per figure: its title, traces, and per trace how many visible SVG marks it drew (plotly keeps the trace
# index on each `g.trace` it draws), and the x of a line trace in drawing order. A visible mark has an area
# (a bar of NaN height is a 0-px-high path: drawn, but nothing to see), except a line's stroke, which may be
# flat, and text, which counts when it says something.
_INSPECT = """() => [...document.querySelectorAll('.js-plotly-plot')].map(el => {
  const visible = n => {
    const b = n.getBBox();
    if (n.tagName === 'text') return n.textContent.trim() !== '' && b.width > 0 && b.height > 0;
    if (n.classList.contains('js-line')) return b.width > 0 || b.height > 0;
    return b.width > 0 && b.height > 0;
  };
  const drawn = {};
  for (const g of el.querySelectorAll('.cartesianlayer g.trace')) {
    const cd = g.__data__, i = cd && cd[0] && cd[0].trace ? cd[0].trace.index : -1;
    drawn[i] = (drawn[i] || 0) + [...g.querySelectorAll('path, text')].filter(visible).length;
  }
  for (const g of el.querySelectorAll('.cartesianlayer g.hm')) {  // a heatmap: one image, its cells' texts
    const cd = g.__data__, i = cd && cd[0] && cd[0].trace ? cd[0].trace.index : -1;
    drawn[i] = (drawn[i] || 0) + [...g.querySelectorAll('image, text')].filter(visible).length;
  }
  const h = el.closest('.fig') && el.closest('.fig').previousElementSibling;
  return {title: h ? h.textContent : '', traces: el.data.length,
          names: el._fullData.map(t => t.name),
          drawn: el._fullData.map((t, i) => drawn[i] || 0),
          ys: el._fullData.map((t, i) => el.calcdata[i].map(p => p.s !== undefined ? p.s : p.y)),
          lines: el._fullData.map((t, i) => t.type === 'scatter' && t.mode.includes('lines')
                                  ? el.calcdata[i].map(p => p.x).filter(Number.isFinite) : null),
          axes: Object.fromEntries(['xaxis', 'yaxis'].filter(a => el._fullLayout[a])
                  .map(a => [a[0], {type: el._fullLayout[a].type, range: el._fullLayout[a].range.slice()}])),
          data: {x: el.calcdata.flatMap(c => c.map(p => p.x)).filter(Number.isFinite),
                 y: el.calcdata.flatMap(c => c.map(p => p.s !== undefined ? p.s : p.y)).filter(Number.isFinite)},
          shapes: (el._fullLayout.shapes || []).map(sh => ({xref: sh.xref, yref: sh.yref, x0: sh.x0, x1: sh.x1,
                                                            y0: sh.y0, y1: sh.y1}))};
})"""


def axis_problems(fig: dict) -> list[str]:
    """What a reader would see wrong on a figure's numeric axes: a visible range that misses plotted data, or spans
    far more than it (a log axis over more than 2 decades beyond its data's, a linear one over more than 10x the
    data's scale on either side), or a reference line (a shape) outside it. Plotly gives a log axis's range, and
    takes a shape's coordinates on it, in log10 units."""
    out = []
    for a, ax in fig["axes"].items():
        vals = fig["data"][a]
        if ax["type"] not in ("linear", "log") or not vals:
            continue
        lo, hi = ax["range"]
        if ax["type"] == "log":
            vals = [math.log10(v) for v in vals if v > 0]
            if not vals:
                continue
        dlo, dhi = min(vals), max(vals)
        span = dhi - dlo
        if lo > dlo + 1e-9 * max(1.0, abs(dlo)) or hi < dhi - 1e-9 * max(1.0, abs(dhi)):
            out.append(f"{fig['title']}: {a} axis {ax['range']} does not show its data [{dlo}, {dhi}]")
        # (one value v: plotly shows v - 1 .. v + 1)
        scale = 10 * max(span, abs(dlo), abs(dhi)) if span > 0 else max(10 * abs(dhi), 1.0)
        slack = 2.0 if ax["type"] == "log" else scale
        if lo < dlo - slack or hi > dhi + slack:
            out.append(f"{fig['title']}: {a} axis ({ax['type']}) runs {ax['range']} for data [{dlo}, {dhi}]")
        for sh in fig["shapes"]:
            if sh[f"{a}ref"] == a:
                for v in (sh[f"{a}0"], sh[f"{a}1"]):
                    if isinstance(v, (int, float)) and not lo <= v <= hi:
                        out.append(f"{fig['title']}: a reference line at {a}={v} is outside the {a} axis {ax['range']}")
    return out


@pytest.fixture(scope="module")
def browser():
    from workbench.report import picture

    why = picture.missing()
    if why:
        pytest.skip(why)
    with picture.browser() as b:
        yield b


def open_report(browser, path: Path, shot: Path, width: int = 1280) -> dict:
    """Open a report in Chromium, wait for plotly to draw every figure; its figures, errors and page width."""
    from workbench.report import picture

    with picture.open_report(browser, path, width) as (page, errors):
        figs = page.evaluate(_INSPECT)
        scroll_w, inner_w = page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
        page.screenshot(path=str(shot), full_page=True)
    return {"expected": picture.figure_count(path), "figures": figs, "errors": list(errors),
            "scroll_width": scroll_w, "width": inner_w}


@pytest.mark.parametrize("kind", list(KINDS))
def test_report_draws_in_chromium(reports, browser, kind):
    path = _need(reports, kind)
    t0 = time.perf_counter()
    shot = reports["tmp"] / f"{kind}.png"
    got = open_report(browser, path, shot)
    figs = got["figures"]
    assert got["errors"] == [], got["errors"]
    assert len(figs) == got["expected"] > 0
    for f in figs:
        assert f["traces"] >= 1, f"{f['title']}: no trace"
        # a trace with no visible mark is blank unless every value it holds is a number: a bar of a true 0 (a
        # tiny study's NDCG@10 can be 0 on some CPUs) is a 0-px path as a NaN bar is, but it shows its value
        blank = [(n, y) for n, d, y in zip(f["names"], f["drawn"], f["ys"])
                 if d == 0 and not (y and all(isinstance(v, (int, float)) and math.isfinite(v) for v in y))]
        assert not blank, f"{f['title']}: traces that drew nothing: {blank}"
        for name, xs in zip(f["names"], f["lines"]):
            assert xs is None or xs == sorted(xs), f"{f['title']}: {name} zig-zags: x in drawing order {xs}"
        assert not axis_problems(f), axis_problems(f)
    assert got["scroll_width"] <= got["width"], f"page {got['scroll_width']} px wide in a {got['width']} px window"
    titles = [f["title"] for f in figs]
    if kind in ("study", "join"):
        assert set(STUDY_FIGURES) <= set(titles)
    if kind == "join":
        assert {"quality vs cost", "quality vs p99 latency"} <= set(titles)
        from workbench.load.matrix import FIGURES

        assert set(FIGURES) <= set(titles)
    if kind == "load":
        lat = next(f for f in figs if f["title"].endswith("latency vs achieved QPS"))
        assert {"torch · float32 p99", "torch · bfloat16 p99"} <= set(lat["names"])
    if kind == "perf":
        assert titles == ["perf: engine time vs compute floor, by phase", "perf: A/B per-request ratio"]
    assert shot.stat().st_size > 10_000
    print(f"\n{kind}: {len(figs)} figures, {sum(f['traces'] for f in figs)} traces drawn, no console errors, "
          f"{time.perf_counter() - t0:.1f}s in Chromium; screenshot {shot}")


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


def test_report_picture_is_small(reports, browser, tmp_path):
    """`workbench report --png` (the README's picture): the top of the page, a fixed width, well under 500 KB."""
    from workbench.report import picture

    kind = "join" if "join" in reports["paths"] else "load"
    png = picture.write_png(reports["paths"][kind], tmp_path / "report.png", in_browser=browser)
    width, height = _png_size(png)
    assert width == picture.WIDTH and 900 <= height <= picture.MAX_HEIGHT, (width, height)
    assert 10_000 < png.stat().st_size < 500_000, png.stat().st_size
    print(f"\n{kind} picture: {width}x{height} px, {png.stat().st_size / 1000:.0f} KB: {png}")
