"""The documentation site builds with warnings as errors, and its pages render in a browser.

The site is built once per test run (the same sphinx-build call as `.ci/docs`, into a temporary
folder). Pages are opened in headless Chromium when it is installed (`.ci/setup` installs it
on Debian as root): its `--dump-dom` gives the DOM after the page's scripts ran (MathJax
typesets the formulas), and a screenshot checks that something was drawn. Without Chromium the built HTML files are parsed
as they are (the same checks, without JavaScript).
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

bs4 = pytest.importorskip("bs4")
pytest.importorskip("sphinx")
pytest.importorskip("myst_nb")

ROOT = Path(__file__).resolve().parent.parent
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def _browser():
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("docs") / "html"
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-E", "-W", "--keep-going", "-n", "-q", "-b", "html",
         str(ROOT / "docs"), str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, f"sphinx-build failed:\n{proc.stdout}\n{proc.stderr}"
    return out


def open_page(path: Path, screenshot: Path | None = None):
    """The page's DOM (after its scripts ran, when a headless browser is available)."""
    browser = _browser()
    if browser is None:
        return bs4.BeautifulSoup(path.read_text(encoding="utf-8"), "html.parser")
    args = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--no-first-run", "--window-size=1280,1000", "--virtual-time-budget=5000"]
    dom = subprocess.run(args + ["--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0 and "<html" in dom.stdout, dom.stderr[-2000:]
    if screenshot is not None:
        subprocess.run(args + [f"--screenshot={screenshot}", path.as_uri()], capture_output=True, timeout=120)
        assert screenshot.exists() and screenshot.stat().st_size > 50_000, "the browser drew (almost) nothing"
    return bs4.BeautifulSoup(dom.stdout, "html.parser")


def local_target(page: Path, src: str) -> Path:
    return (page.parent / unquote(urlparse(src).path)).resolve()


def test_start_page(site, tmp_path):
    page = site / "index.html"
    soup = open_page(page, screenshot=tmp_path / "index.png")
    assert "smc_jax" in soup.title.get_text()
    assert soup.find("h1") is not None and "smc_jax" in soup.find("h1").get_text()
    nav = soup.select("nav.bd-docs-nav a, nav a.reference")
    labels = " | ".join(a.get_text(" ", strip=True) for a in nav)
    for label in ("Getting started", "Benchmarks", "API reference", "smc_jax quickstart"):
        assert label in labels, labels
    for a in nav:  # every navigation link leads to a built page
        href = a.get("href", "")
        if href and not href.startswith(("http", "#", "mailto:")):
            assert local_target(page, href).exists(), href
    assert soup.select("div.highlight pre"), "no code block on the start page"
    if _browser() is not None:  # MathJax (served from _static) typeset the formula
        assert soup.select("mjx-container"), "the formula on the start page was not typeset"


def test_api_page(site, tmp_path):
    page = site / "api" / "index.html"
    soup = open_page(page, screenshot=tmp_path / "api.png")
    assert "API reference" in soup.find("h1").get_text()
    table = " ".join(a.get_text() for a in soup.select("table.autosummary a"))
    import smc_jax
    for name in smc_jax.__all__:
        assert name in table, f"smc_jax.{name} is not in the API reference's table"
    module = open_page(site / "api" / "generated" / "smc_jax.sampler.html")
    functions = {dt.get("id") for dt in module.select("dl.py.function > dt")}
    assert "smc_jax.sampler.sample" in functions, functions
    # numpy docstrings rendered by napoleon: a Parameters field list
    assert module.select("dl.field-list"), "no Parameters section rendered"


def test_notebook_plot_and_code(site):
    page = site / "notebooks" / "quickstart.html"
    soup = open_page(page)
    assert soup.select("div.cell_input div.highlight pre"), "no code cell"
    images = [img for img in soup.select("div.cell_output img")]
    assert images, "no rendered plot in the quickstart notebook (are its outputs committed?)"
    for img in images:
        src = img.get("src", "")
        assert src.startswith("data:image") or local_target(page, src).stat().st_size > 1000, src


def test_every_notebook_and_page_built(site):
    for name in ("getting_started", "semantics", "bytes", "learning", "devices", "evaluation", "benchmarks"):
        assert (site / f"{name}.html").exists(), name
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        assert (site / "notebooks" / f"{notebook.stem}.html").exists(), notebook.name


def test_every_result_table_renders(site):
    """Each markdown table of benchmarks/results/*.md is an HTML table on the benchmarks page."""
    import re

    expected = sum(len(re.findall(r"^\|(?: ?:?-+:? ?\|)+\s*$", path.read_text(), re.M))
                   for path in (ROOT / "benchmarks" / "results").glob("*.md"))
    page = bs4.BeautifulSoup((site / "benchmarks.html").read_text(encoding="utf-8"), "html.parser")
    assert len(page.select("table")) >= expected > 0
