"""A picture of a report: the HTML page as headless Chromium draws it, saved as a PNG.

Why: the README shows what a report looks like, and a picture taken by hand goes stale. `workbench report
... --png FILE` (and `make report-picture`, for the quickstart's report) takes it the same way the browser
test opens every kind of report (tests/test_report_browser.py uses `open_report` below): the system
Chromium (`/usr/bin/chromium`, Debian's; Playwright drives it, no browser is downloaded), the page loaded
from its file, and the picture taken only once plotly has drawn every figure. The picture is the top of the
page at a fixed width (`WIDTH`), at most `MAX_HEIGHT` pixels tall, so it stays small.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

from workbench.errors import UsageError

CHROMIUM = Path("/usr/bin/chromium")
WIDTH = 1200  # px: the report's own max-width, so nothing wraps differently from a desktop browser
MAX_HEIGHT = 2400  # px: the top of the page (the question, its answer and the first figures)
_ALL_DRAWN = """n => window.Plotly && document.querySelectorAll('.js-plotly-plot').length === n &&
    [...document.querySelectorAll('.js-plotly-plot')].every(el => el._fullLayout && el.calcdata)"""


class PictureError(UsageError):
    """No browser to draw the report with; the message says what to install."""


def missing() -> str | None:
    """Why no picture can be taken here (what to install), or None when Chromium and Playwright are both there."""
    if not CHROMIUM.exists():
        return (f"no Chromium at {CHROMIUM}: install it with `bash scripts/install_system_deps.sh` "
                "(apt-get install -y chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright is not installed: pip install -e '.[test]' (it drives the system Chromium)"
    return None


@contextlib.contextmanager
def browser() -> Iterator:
    """Headless Chromium under Playwright, closed on exit; a PictureError saying what to install if it cannot start."""
    why = missing()
    if why:
        raise PictureError(why)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=["--disable-gpu"])
        try:
            yield b
        finally:
            b.close()


@contextlib.contextmanager
def open_report(b, path: Path, width: int = WIDTH, height: int = 900) -> Iterator[tuple]:
    """(page, errors): report `path` open in browser `b` once plotly drew every figure; `errors` collects the
    page's console errors and exceptions. The page is closed on exit."""
    page = b.new_page(viewport={"width": width, "height": height})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    try:
        page.goto(Path(path).resolve().as_uri(), wait_until="load")
        page.wait_for_function(_ALL_DRAWN, arg=figure_count(path), timeout=30_000)
        yield page, errors
    finally:
        page.close()


def figure_count(path: Path) -> int:
    """How many plotly figures the report file holds (each is one `Plotly.newPlot` call)."""
    return Path(path).read_text(encoding="utf-8").count("Plotly.newPlot(")


def write_png(report: Path, png: Path, width: int = WIDTH, max_height: int = MAX_HEIGHT, in_browser=None) -> Path:
    """A PNG of HTML report `report`: `width` px wide, the whole page or its top `max_height` px; in browser
    `in_browser` where one is open already (one Playwright per thread), else in one started for it."""
    report, png = Path(report), Path(png)
    if not report.is_file():
        raise PictureError(f"no report at {report}: write it first (workbench report --experiment NAME -o {report})")
    png.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        b = in_browser or stack.enter_context(browser())
        page, errors = stack.enter_context(open_report(b, report, width))
        if errors:
            raise RuntimeError(f"the report {report} drew with errors: {errors}")
        full = page.evaluate("() => document.documentElement.scrollHeight")
        page.screenshot(path=str(png), full_page=True,
                        clip={"x": 0, "y": 0, "width": width, "height": min(full, max_height)})
    return png
