"""The dashboard in a real browser (issue 12): Debian's headless Chromium, driven by Selenium through Debian's
ChromeDriver (the same version; nothing is downloaded), against the service on 127.0.0.1.

The jobs are made directly in the store with engine-shaped events (tests/test_service_metrics.py), so no Ray
is needed. The page is checked as a person would see it: the key form, the jobs list, a finished job's funnel,
drop reasons, shards and throughput lines, a running job's funnel moving when new events arrive, the
schedules panel shown only when ``/v1/schedules`` answers, the mixtures panel (sources, pinned versions,
weights, planned tokens), the ablations panel (state; each variant's mean and spread), a job name made of
HTML shown as text, and a refused key. A screenshot of the finished job is saved (its path is printed; ``-s`` shows it).

Chromium comes from scripts/install_chromium.sh. Without it the test skips, saying so, except on CI
(``CI=true``), where a missing browser is a failure.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest
import uvicorn
from fastapi.responses import JSONResponse

from service.api.app import create_app
from service.settings import Settings
from service.store import repo
from service.store.models import JobState
from tests.ports import free_port
from tests.test_service_metrics import SHARD_TOKENS, STAGES, add_events, engine_events, seed_job, stage_counters

pytestmark = pytest.mark.slow

#: seconds to wait for the page to show something: the page polls every 2-3 s; the machine may be busy
WAIT_S = 20


def _browser_paths() -> tuple[str, str]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    why = None
    try:
        import selenium  # noqa: F401
    except ImportError:
        why = "the selenium package is not installed (pip install -e '.[test]')"
    if chromium is None or driver is None:
        why = "Chromium or ChromeDriver is missing: run scripts/install_chromium.sh (as root)"
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true needs the browser test: {why}")
        pytest.skip(why)
    return chromium, driver


@pytest.fixture(scope="module")
def browser() -> Iterator:
    chromium, driver_path = _browser_paths()
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    opts.binary_location = chromium
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the page's console, for failure messages
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1100", "--no-first-run", "--disable-extensions", "--lang=en-US"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(driver_path), options=opts)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


class Gate:
    """ASGI wrapper that answers 404 for the path prefixes in ``hidden``: a service without those routes."""

    def __init__(self, app):
        self.app = app
        self.hidden: set[str] = set()
        self.refused: Counter[str] = Counter()

    async def __call__(self, scope, receive, send) -> None:
        prefix = next((p for p in self.hidden if scope.get("path", "").startswith(p)), None)
        if scope["type"] == "http" and prefix is not None:
            self.refused[prefix] += 1
            await JSONResponse({"detail": "Not Found"}, 404)(scope, receive, send)
            return
        await self.app(scope, receive, send)


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[tuple[str, object, str]]:
    """``(base_url, app, token)``: the service (API only) on a SQLite file, served by uvicorn in a thread."""
    tmp = tmp_path_factory.mktemp("dashboard")
    app = create_app(Settings(state_dir=tmp / "state", run_supervisor=False, events_poll_s=0.2))
    port = free_port()
    app.state.gate = Gate(app)
    srv = uvicorn.Server(uvicorn.Config(app.state.gate, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    end = time.monotonic() + 30
    while not srv.started:
        assert thread.is_alive() and time.monotonic() < end, "the service did not start"
        time.sleep(0.05)
    with app.state.db.session() as s:
        _, token = repo.create_key(s, "dashboard")
    yield f"http://127.0.0.1:{port}", app, token
    srv.should_exit = True
    thread.join(timeout=10)


def _wait(driver, what: str, predicate, timeout: float = WAIT_S):
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.1).until(lambda d: predicate(d))
    except Exception as exc:  # noqa: BLE001 - say what was awaited, with the page's state
        status = driver.find_element("id", "status").text
        console = [e.get("message") for e in driver.get_log("browser")]
        raise AssertionError(f"timed out waiting for {what}; status line: {status!r}; console: {console}") from exc


def _funnel(driver) -> dict[str, tuple[int, int]]:
    """The funnel's rows, read in one script call (the page redraws them while it polls)."""
    rows = driver.execute_script(
        "return [...document.querySelectorAll('#funnel g.stage')].map((g) => [g.dataset.stage, g.dataset.in, "
        "g.dataset.out])")
    return {stage: (int(n_in), int(n_out)) for stage, n_in, n_out in rows}


def _rows(driver, table: str) -> list[list[str]]:
    return driver.execute_script(
        "return [...document.querySelectorAll(`#${arguments[0]} tbody tr`)].map((tr) => "
        "[...tr.cells].map((td) => td.textContent))", table)


def _click(driver, css: str, timeout: float = WAIT_S) -> None:
    """Click what ``css`` names, again if the page redrew it between finding and clicking (the lists are
    re-rendered on every poll, so a found row can be stale by the time the click reaches it), or if the layout
    moved between the scroll and the click (a panel above it filled in, e.g. the log, and another element is
    now under the point; CI saw this)."""
    from selenium.common.exceptions import ElementClickInterceptedException, StaleElementReferenceException

    end = time.monotonic() + timeout
    while True:
        try:
            driver.find_element("css selector", css).click()
            return
        except (StaleElementReferenceException, ElementClickInterceptedException):
            if time.monotonic() > end:
                raise
            time.sleep(0.05)


def _open_job(driver, job_id: str) -> None:
    _click(driver, f"#jobs tr[data-job='{job_id}']")
    _wait(driver, f"job {job_id} in the panel",
          lambda d: d.find_element("id", "job-panel").get_attribute("data-job") == job_id)


def test_dashboard_shows_jobs_funnels_and_live_progress(browser, server, tmp_path):
    base, app, token = server
    db = app.state.db
    t0 = time.time() - 120
    done = seed_job(db, "reference-run", events=engine_events("reference-run", t0))
    live = seed_job(db, "live-run", events=engine_events("live-run", t0, shards=1, finish=False),
                    state=JobState.RUNNING)
    tricky = seed_job(db, '<img src=x onerror="document.title=1">', state=JobState.QUEUED)

    browser.get(base + "/")
    assert browser.find_element("id", "key-form").is_displayed()
    assert not browser.find_element("id", "main").is_displayed()  # nothing shown, nothing fetched, without a key
    browser.find_element("id", "key").send_keys(token)
    browser.find_element("css selector", "#key-form button").click()
    _wait(browser, "three jobs listed", lambda d: len(_rows(d, "jobs")) == 3)
    listed = {row[0]: row[2] for row in _rows(browser, "jobs")}  # name, short id, state, created
    assert listed == {"reference-run": "SUCCEEDED", "live-run": "RUNNING",
                      '<img src=x onerror="document.title=1">': "QUEUED"}  # the HTML name is text
    assert browser.find_elements("css selector", "#jobs img") == [] and browser.title == "tokenmill"
    assert tricky and browser.execute_script("return sessionStorage.getItem('tokenmill.apiKey')") == token

    # a finished job: funnel, drop reasons, shards, throughput lines
    _open_job(browser, done)
    expected = {key.split("-", 1)[1]: (n_in, n_out) for key, n_in, n_out, _, _ in STAGES}
    _wait(browser, "the funnel", lambda d: _funnel(d) == expected)
    _wait(browser, "the throughput lines",
          lambda d: d.find_element("css selector", "#throughput .tokens-lane").get_attribute("data-points") == "3")
    assert browser.find_element("css selector", "#throughput .docs-lane").get_attribute("data-points") == "2"
    assert len(browser.find_elements("css selector", "#throughput path.docs")) == 1
    assert browser.find_element("id", "job-title").text == "reference-run"
    meta = browser.find_element("id", "job-meta").text
    assert "SUCCEEDED" in meta and "tokens/s (write-phase average)" in meta and "whole-job average" in meta
    # the chart's peaks are rates between shard writes; its dashed line is the header's write-phase average
    average = browser.find_element("css selector", "#throughput .tokens-lane line.average")
    assert float(average.get_attribute("data-average")) > 0
    assert "between shard writes" in browser.find_element("css selector", "#throughput .tokens-lane").text
    drops = _rows(browser, "drops")
    assert drops == [["length", "length:too_short", "70"], ["exact_dedup", "exact_duplicate", "50"]]
    n = len(SHARD_TOKENS)
    assert browser.find_element("id", "shards-text").text == f"{n} of {n} shards written"
    funnel_text = browser.find_element("id", "funnel").text
    assert "read" in funnel_text and "1,020 \u2192 1,020" in funnel_text and "950 \u2192 900" in funnel_text
    shot = tmp_path / "dashboard.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    print(f"screenshot: {shot}")

    # a running job: its funnel and shards follow new events without a reload
    _open_job(browser, live)
    _wait(browser, "the running job's funnel", lambda d: _funnel(d) == expected)
    assert browser.find_element("id", "shards-text").text.startswith("1 written so far")
    assert browser.find_element("id", "job-activity").text.startswith("writing shards")
    add_events(db, live, [{"type": "stage_counters", "ts": t0 + 8, "stages": stage_counters(2.0)},
                          {"type": "shard_written", "ts": t0 + 9, "name": "shards/shard-000001.tar",
                           "sha256": "1" * 64, "samples": 16, "tokens": 10, "writer": "h:1"}])
    doubled = {name: (2 * a, 2 * b) for name, (a, b) in expected.items()}
    _wait(browser, "the funnel to move", lambda d: _funnel(d) == doubled)
    _wait(browser, "the new shard", lambda d: d.find_element("id", "shards-text").text.startswith("2 written so far"))
    assert browser.find_element("id", "job-panel").get_attribute("data-state") == "RUNNING"


def test_schedules_panel_shows_next_fire_times_only_when_the_api_has_schedules(browser, server):
    import httpx

    base, app, token = server
    gate = app.state.gate
    root = app.state.settings.state_dir / "data"  # the default root
    spec = {"name": "nightly", "inputs": [{"path": str(root / "incoming" / "*.jsonl")}],
            "stages": [{"type": "exact_dedup"}], "output": {"path": str(root / "nightly")}}
    r = httpx.post(base + "/v1/schedules", json={"cron": "0 3 * * *", "spec": spec},
                   headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 201, r.text
    created = r.json()
    browser.get(base + "/")
    browser.execute_script("sessionStorage.setItem('tokenmill.apiKey', arguments[0])", token)
    browser.refresh()
    _wait(browser, "the schedules panel", lambda d: d.find_element("id", "schedules-panel").is_displayed())
    [row] = _rows(browser, "schedules")
    shown = browser.execute_script("return new Date(arguments[0]).toLocaleString()", created["next_fire_at"])
    assert row == ["nightly", "0 3 * * * (UTC)", shown, "active", "-", "-"]

    # a service without the schedules API (404): the panel stays hidden
    gate.hidden.add("/v1/schedules")
    try:
        browser.refresh()
        _wait(browser, "the jobs list", lambda d: d.find_element("id", "main").is_displayed())
        _wait(browser, "the schedules request", lambda d: gate.refused["/v1/schedules"] > 0)
        time.sleep(0.5)
        assert not browser.find_element("id", "schedules-panel").is_displayed()
    finally:
        gate.hidden.clear()


def test_mixtures_panel_shows_sources_pinned_versions_weights_and_planned_tokens(browser, server):
    from pipeline.mixture_format import Mixture, MixtureSource
    from service.store.mixtures import save_mixture

    base, app, token = server
    sources = [MixtureSource("web", "/v1/jobs/0123456789abcdef/artifacts", "a" * 64, 0.75, 300, 200, 9000, 1.5,
                             {"job": "0123456789abcdef"}),
               MixtureSource("books", "/v1/schedules/fedcba9876543210/versions/3/artifacts", "b" * 64, 0.25, 100,
                             400, 3000, 0.25, {"schedule": "fedcba9876543210", "version": 3})]
    mixture = Mixture(seed=0, seq_len=64, dtype="uint16", vocab_size=256, tokenizer_hash="t", pad_id=0,
                      sources=sources)
    with app.state.db.session() as s:
        row, _ = save_mixture(s, name="blend", spec={}, document=mixture.to_json(), samples=400, tokens=12000)
        mixture_id = row.id
    browser.get(base + "/")
    browser.execute_script("sessionStorage.setItem('tokenmill.apiKey', arguments[0])", token)
    browser.refresh()
    _wait(browser, "the mixtures panel", lambda d: d.find_element("id", "mixtures-panel").is_displayed())
    assert _rows(browser, "mixtures") == [
        ["blend", mixture_id[:8], "web", "job 01234567", "0.750", "9,000", "1.50"],
        ["books", "schedule fedcba98 v3", "0.250", "3,000", "0.25"]]


def test_ablations_panel_shows_each_ablations_state_and_each_variants_mean_and_spread(browser, server, tmp_path):
    import json

    from service.store.models import ABLATION

    base, app, token = server
    out = tmp_path / "ablation"
    out.mkdir()
    (out / "steps.jsonl").write_text(json.dumps({"step": "split", "event": "done", "digest": "d"}) + "\n")
    scores = {name: {"common": {"mean": mean, "spread": spread, "n": 3, "min": 0, "max": 0}}
              for name, mean, spread in (("raw", 2.5, 0.05), ("curated", 2.25, 0.0125))}
    (out / "ablation.json").write_text(json.dumps({"variants": {k: {"scores": v} for k, v in scores.items()},
                                                   "gaps": {"raw-curated": {"common": {"gap": 0.25}}}}))
    with app.state.db.session() as s:
        done, _ = repo.create_job(s, {}, name="curation", spec_hash="h", output_path=str(out), kind=ABLATION)
        done.state = "SUCCEEDED"
        queued, _ = repo.create_job(s, {}, name="later", spec_hash="h", output_path=str(tmp_path / "none"),
                                    kind=ABLATION)
        ids = done.id, queued.id
    browser.get(base + "/")
    browser.execute_script("sessionStorage.setItem('tokenmill.apiKey', arguments[0])", token)
    browser.refresh()
    _wait(browser, "the ablations panel", lambda d: d.find_element("id", "ablations-panel").is_displayed())
    assert _rows(browser, "ablations") == [
        ["later", ids[1][:8], "QUEUED", "0 steps done", "-", "-"],
        ["curation", ids[0][:8], "SUCCEEDED", "raw", "2.5000", "0.0500"], ["curated", "2.2500", "0.0125"]]


def test_a_refused_key_is_forgotten(browser, server):
    base, _, _ = server
    browser.get(base + "/")
    browser.execute_script("sessionStorage.clear()")
    browser.refresh()
    browser.find_element("id", "key").send_keys("tm_000000000000_" + "A" * 43)
    browser.find_element("css selector", "#key-form button").click()
    _wait(browser, "the refusal", lambda d: "refused" in d.find_element("id", "status").text)
    assert browser.find_element("id", "key-form").is_displayed()
    assert not browser.find_element("id", "main").is_displayed()
    assert browser.execute_script("return sessionStorage.getItem('tokenmill.apiKey')") is None


def test_static_files_are_served_with_a_strict_policy(server):
    import httpx

    base, _, _ = server
    page = httpx.get(base + "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    for name in ("app.js", "style.css"):
        r = httpx.get(f"{base}/dashboard/{name}")
        assert r.status_code == 200 and r.headers["x-content-type-options"] == "nosniff"
    for text in (page.text, httpx.get(f"{base}/dashboard/style.css").text):
        assert "://" not in text and "@import" not in text  # nothing from a CDN or any other origin
    for bad in ("/dashboard/__init__.py", "/dashboard/..%2Fapp.py", "/dashboard/%2e%2e/routers/jobs.py",
                "/dashboard/index.html/x"):
        r = httpx.get(base + bad)
        assert r.status_code == 404 and b"import" not in r.content, bad
