"""The dashboard as a console (issue 22), in a real browser against a real ``tokenmill serve`` that runs jobs
(a job process with a local Ray each, ``--max-running 1``), everything done through the page as a person would:

- submit a small job (a few dozen documents, a 260-token vocabulary) from the spec box and watch it run: while
  it has no shard the page says what it is doing (never "0 of ? shards"), then SUCCEEDED; its id, output
  path, artifacts (manifest.json shown in the page equals the file on disk; a shard downloaded through a Blob
  URL has the manifest's sha256) and its log;
- submit a second job of the same name (it waits QUEUED behind the first; the two rows differ by id), the
  same Idempotency-Key again (the same job, not a new one), cancel it, retry it, cancel it again, each button's
  answer shown;
- a spec pasted as YAML (the API reads it as written); YAML with a syntax error refused with its line and
  column, an invalid spec's 422 and a path outside the roots' 403 shown per field;
- a schedule (created through the API on the first job's parent folder, so it adopts that job's output as its
  version 1; one run seeded in the store): its versions with their figures and files, its runs with a link to
  the job, pause and resume and delete, each after a confirmation.

Screenshots (the job list with a running job, the finished job, the schedule) go to ``$TOKENMILL_SCREENSHOTS``
or the test's tmp folder; the folder is printed (``-s``). The browser comes as in tests/test_dashboard_browser.py
(skipped without it, a failure on CI).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
import yaml

from service.store import repo
from service.store.db import Database
from service.store.models import RunState
from tests.corpus_fixtures import make_text, write_jsonl
from tests.processes import kill_all, processes_naming
from tests.test_dashboard_browser import _browser_paths, _click, _rows, _wait

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
#: a job process starts a Ray node and runs three phases: on a busy two-core machine, up to a minute or two
JOB_S = 150


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[tuple[str, str, Path, Path]]:
    """``(base_url, token, data_root, state_dir)``: ``tokenmill serve --max-running 1`` in a subprocess."""
    tmp = tmp_path_factory.mktemp("console")
    root, state = tmp / "data", tmp / "state"
    rng = random.Random(22)
    write_jsonl(root / "in" / "a.jsonl", [{"id": f"d{i}", "text": make_text(rng, rng.choice([20, 40, 80]))}
                                          for i in range(48)])
    state.mkdir()
    db = Database(f"sqlite:///{state / 'tokenmill.db'}")
    db.migrate()
    with db.session() as s:
        _, token = repo.create_key(s, "console")
    db.dispose()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ray_tmp = tempfile.mkdtemp(prefix="tmc", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    env = {**os.environ, "RAY_TMPDIR": ray_tmp, "PYTHONPATH": str(ROOT), "TOKENMILL_TEST_CPUS": "2"}
    log = open(tmp / "serve.log", "wb")  # noqa: SIM115 - the child holds it
    proc = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
         "--state-dir", str(state), "--root", str(root), "--job-cpus", "2", "--max-running", "1",
         "--log-level", "warning"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        end = time.monotonic() + 90
        while True:
            assert proc.poll() is None, (tmp / "serve.log").read_text()
            try:
                if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < end, "the service did not become ready"
            time.sleep(0.1)
        yield base, token, root, state
    finally:
        proc.kill()
        proc.wait(timeout=30)
        log.close()
        kill_all(processes_naming(str(state)))  # job processes
        kill_all(processes_naming(ray_tmp))  # and their Ray
        shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def downloads(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("downloads")


@pytest.fixture(scope="module")
def console(downloads) -> Iterator:
    """Headless Chromium that saves downloads into ``downloads`` without asking."""
    chromium, driver_path = _browser_paths()
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    opts.binary_location = chromium
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    opts.add_experimental_option("prefs", {"download.default_directory": str(downloads),
                                           "download.prompt_for_download": False})
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1500,1300", "--no-first-run", "--disable-extensions", "--lang=en-US"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(driver_path), options=opts)
    driver.set_page_load_timeout(30)
    driver.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
    yield driver
    driver.quit()


def _spec(root: Path, out: str, name: str = "console") -> dict:
    return {"name": name, "inputs": [{"path": str(root / "in" / "*.jsonl")}],
            "stages": [{"type": "normalize"}, {"type": "exact_dedup"}],
            "tokenizer": {"train": {"vocab_size": 260, "sample_docs": 48}},
            "packing": {"seq_len": 64, "range_docs": 100},
            "output": {"path": str(root / out), "samples_per_shard": 16},
            "execution": {"parallelism": 1, "batch_size": 16}}


def _text(driver, element_id: str) -> str:
    return driver.execute_script("return document.getElementById(arguments[0]).textContent", element_id)


def _submit(driver, body: str, idempotency_key: str = "") -> None:
    """Type ``body`` into the spec box (replacing what is there) and press Submit."""
    if not driver.find_element("id", "submit-form").is_displayed():
        _click(driver, "#submit-details summary")
    driver.execute_script("const r = document.getElementById('submit-result'); r.textContent = ''; "
                          "r.removeAttribute('data-job')")
    for element_id, value in (("spec", body), ("idempotency", idempotency_key)):
        box = driver.find_element("id", element_id)
        box.clear()
        if value:
            box.send_keys(value)
    _click(driver, "#submit")


def _submitted(driver) -> str:
    """The id of the job the last submission queued or found, once the page says so."""
    _wait(driver, "the submission's answer", lambda d: d.find_element("id", "submit-result").get_attribute("data-job")
          and "job" in _text(d, "submit-result"))
    return driver.find_element("id", "submit-result").get_attribute("data-job")


def _panel(driver, job_id: str, state: str | None = None, timeout: float = 20) -> None:
    def shown(d) -> bool:
        panel = d.find_element("id", "job-panel")
        return panel.get_attribute("data-job") == job_id and state in (None, panel.get_attribute("data-state"))

    _wait(driver, f"job {job_id} shown{' ' + state if state else ''}", shown, timeout)


def _press(driver, element_id: str, answer: str) -> str:
    _click(driver, f"#{element_id}")
    _wait(driver, f"{element_id}'s answer", lambda d: answer in _text(d, "job-action"))
    return _text(driver, "job-action")


def _watch(driver, api: httpx.Client, job_id: str, seen: list[list[str]], until) -> None:
    """Sample the panel's ``[state, activity line, shards line]`` into ``seen`` until ``until(sample)``."""
    end = time.monotonic() + JOB_S
    while True:
        now = driver.execute_script(
            "return [document.getElementById('job-panel').dataset.state, "
            "document.getElementById('job-activity').textContent, "
            "document.getElementById('shards-text').textContent]")
        seen.append(now)
        if until(now):
            return
        assert now[0] in ("", None, "QUEUED", "RUNNING"), (now, api.get(f"/v1/jobs/{job_id}/logs").text[-3000:])
        assert time.monotonic() < end, f"job {job_id} did not get there: {now}"
        time.sleep(0.2)


def _shot(driver, folder: Path, name: str) -> None:
    path = folder / name
    assert driver.save_screenshot(str(path)) and path.stat().st_size > 10_000


def test_the_console_submits_follows_cancels_and_opens_artifacts_and_schedules(console, served, downloads,
                                                                                 tmp_path):
    base, token, root, state = served
    shots = Path(os.environ.get("TOKENMILL_SCREENSHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    api = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    driver = console
    driver.get(base + "/")
    driver.find_element("id", "key").send_keys(token)
    _click(driver, "#key-form button")
    _wait(driver, "the console", lambda d: d.find_element("id", "jobs-panel").is_displayed())

    # YAML with a syntax error: its line and column; an invalid spec's 422 is shown field by field
    _submit(driver, "name: web\ninputs: [\n  - path: a\n")
    _wait(driver, "the YAML refusal", lambda d: d.find_elements("css selector", "#submit-errors li"))
    [problem] = driver.find_elements("css selector", "#submit-errors li")
    assert problem.get_attribute("data-loc") == "(the spec)" and "line 3, column" in problem.text, problem.text
    bad = _spec(root, "bad")
    bad["execution"]["batch_size"] = 0
    _submit(driver, json.dumps(bad))
    _wait(driver, "the field errors", lambda d: d.find_elements("css selector", "#submit-errors li"))
    assert _text(driver, "submit-result").startswith("HTTP 422")
    [problem] = driver.find_elements("css selector", "#submit-errors li")
    assert problem.get_attribute("data-loc") == "execution.batch_size"
    assert problem.text.startswith("execution.batch_size: ") and "greater than or equal to 1" in problem.text
    outside = _spec(root, "bad")
    outside["inputs"][0]["path"] = str(root.parent / "elsewhere" / "*.jsonl")  # not below --root
    _submit(driver, json.dumps(outside))
    _wait(driver, "the 403", lambda d: _text(d, "submit-result").startswith("HTTP 403"))
    assert [li.get_attribute("data-loc") for li in driver.find_elements("css selector", "#submit-errors li")] \
        == ["inputs[0].path"]
    assert api.get("/v1/jobs").json()["items"] == []  # nothing was queued

    # the first job, pasted as YAML: what it is doing while it has no shard, never "0 of ? shards"
    _submit(driver, yaml.safe_dump(_spec(root, "sched/v000001"), sort_keys=False))
    first = _submitted(driver)
    assert _text(driver, "submit-result") == f"queued as job {first}"
    _panel(driver, first)
    assert _text(driver, "job-id") == first[:8] and driver.find_element("id", "job-id").get_attribute("title") == first
    assert _text(driver, "job-output") == str(root / "sched" / "v000001")
    seen: list[list[str]] = []
    _watch(driver, api, first, seen, until=lambda now: now[0] == "RUNNING")
    _shot(driver, shots, "jobs-running.png")

    # meanwhile a second one of the same name waits behind it (--max-running 1); its Idempotency-Key again
    # gives the same job
    _submit(driver, json.dumps(_spec(root, "second")), idempotency_key="second-1")
    second = _submitted(driver)
    assert second != first
    _panel(driver, second, "QUEUED")
    _submit(driver, json.dumps(_spec(root, "second")), idempotency_key="second-1")
    _wait(driver, "the same job again", lambda d: "made job" in _text(d, "submit-result"))
    assert driver.find_element("id", "submit-result").get_attribute("data-job") == second
    _wait(driver, "both jobs listed", lambda d: len(_rows(d, "jobs")) == 2)
    rows = {row[1]: row for row in _rows(driver, "jobs")}  # name, short id, state, created
    assert set(rows) == {first[:8], second[:8]} and {row[0] for row in rows.values()} == {"console"}
    titles = driver.execute_script("return [...document.querySelectorAll('#jobs tbody code.id')].map((c) => c.title)")
    assert sorted(titles) == sorted([first, second])  # the whole id on hover

    # cancel the queued one, retry it, cancel it again: each answer shown, the buttons follow the state
    assert driver.find_element("id", "job-cancel").is_displayed()
    assert not driver.find_element("id", "job-retry").is_displayed()
    assert "HTTP 202, the job is CANCELLED" in _press(driver, "job-cancel", "cancel: HTTP 202")
    _panel(driver, second, "CANCELLED")
    _wait(driver, "the retry button", lambda d: d.find_element("id", "job-retry").is_displayed())
    assert not driver.find_element("id", "job-cancel").is_displayed()
    assert "HTTP 202, the job is QUEUED" in _press(driver, "job-retry", "retry: HTTP 202")
    _wait(driver, "the cancel button again", lambda d: d.find_element("id", "job-cancel").is_displayed())
    _press(driver, "job-cancel", "cancel: HTTP 202")
    _panel(driver, second, "CANCELLED", timeout=60)  # by CANCELLING, if the first job ended meanwhile
    _wait(driver, "the retry button", lambda d: d.find_element("id", "job-retry").is_displayed())
    assert api.get(f"/v1/jobs/{second}").json()["state"] == "CANCELLED"

    # back to the first job, until SUCCEEDED
    _click(driver, f"#jobs tr[data-job='{first}']")
    _panel(driver, first)
    _watch(driver, api, first, seen, until=lambda now: now[0] == "SUCCEEDED")
    running = [now for now in seen if now[0] == "RUNNING"]
    assert running and all("of ?" not in shards and activity for _, activity, shards in running), seen
    before_shard = [(activity, shards) for _, activity, shards in running if shards.startswith("no shard yet")]
    assert all(shards == f"no shard yet: {activity}" for activity, shards in before_shard), before_shard
    words = ("starting", "Ray", "curating", "training the tokenizer", "writing shards", "publishing",
             "between phases", "its work is done")
    assert all(any(w in activity for w in words) for _, activity, _ in running), running

    job = api.get(f"/v1/jobs/{first}").json()
    out = root / "sched" / "v000001"
    manifest = json.loads((out / "manifest.json").read_text())
    n = len(manifest["shards"])
    assert n >= 1 and job["shards"]["total"] == n
    _wait(driver, "the shard count", lambda d: _text(d, "shards-text") == f"{n} of {n} shards written")
    assert _text(driver, "job-activity").startswith("finished in ")
    assert "tokens/s (write-phase average)" in _text(driver, "job-meta")

    # its artifacts: the API's list; manifest.json shown in the page; a shard saved through a Blob URL
    listed = sorted(f["name"] for f in api.get(f"/v1/jobs/{first}/artifacts").json()["files"])
    assert {"manifest.json", "stats.json", "tokenizer.json"} <= set(listed)
    assert len([x for x in listed if x.startswith("shards/")]) == n
    _wait(driver, "the artifacts", lambda d: sorted(d.execute_script(
        "return [...document.querySelectorAll('#job-artifacts tbody tr')].map((tr) => tr.dataset.name)")) == listed)
    _click(driver, "#job-artifacts button.view[data-name='manifest.json']")
    _wait(driver, "manifest.json in the page", lambda d: d.find_element("css selector", "#job-artifacts pre.viewer")
          .get_attribute("data-name") == "manifest.json")
    shown = json.loads(driver.execute_script(
        "return document.querySelector('#job-artifacts pre.viewer').textContent"))
    assert shown == manifest
    shard = manifest["shards"][0]
    _click(driver, f"#job-artifacts button.download[data-name='{shard['name']}']")
    saved = downloads / Path(shard["name"]).name
    _wait(driver, "the downloaded shard", lambda d: saved.exists() and saved.stat().st_size == shard["bytes"])
    assert hashlib.sha256(saved.read_bytes()).hexdigest() == shard["sha256"]
    assert "bytes saved" in driver.find_element("css selector", "#job-artifacts .artifact-note").text

    # its dataset card above the files: README.md as text, every SVG figure it names drawn in the page
    card_md = api.get(f"/v1/jobs/{first}/artifacts/README.md").text
    named = sorted(set(re.findall(r"\]\((card/[a-z]+\.svg)\)", card_md)))
    assert "README.md" in listed and {"card/funnel.svg", "card/lengths.svg"} <= set(named) <= set(listed)
    _wait(driver, "the card's figures", lambda d: sorted(d.execute_script(
        "return [...document.querySelectorAll('#job-artifacts .card-view figure')]"
        ".filter((f) => f.querySelector('svg.card-figure path')).map((f) => f.dataset.name)")) == named)
    assert driver.execute_script("return document.querySelector('#job-artifacts pre.card-text').textContent") \
        == card_md
    driver.execute_script("document.querySelector('#job-artifacts .card-view').scrollIntoView()")
    _shot(driver, shots, "job-card.png")

    # its log
    _wait(driver, "the log", lambda d: "attempt 1" in _text(d, "log"))
    assert _text(driver, "log") in api.get(f"/v1/jobs/{first}/logs", params={"source": "job"}).text
    assert _text(driver, "log-info").startswith("attempt 1")
    driver.execute_script("window.scrollTo(0, 0)")
    _shot(driver, shots, "job-finished.png")

    # a schedule on the first job's parent folder adopts its output as version 1; one run seeded in the store
    sched_spec = _spec(root, "sched")
    r = api.post("/v1/schedules", json={"name": "refresh", "cron": "0 3 * * *", "spec": sched_spec})
    assert r.status_code == 201, r.text
    sched = r.json()
    db = Database(f"sqlite:///{state / 'tokenmill.db'}")
    try:
        with db.session() as s:
            row = repo.lock_schedule(s, sched["id"])
            repo.add_run(s, row, fire_at=datetime.now(UTC), state=RunState.SUCCEEDED, message="seeded",
                         job_id=first, version=1)
    finally:
        db.dispose()
    driver.refresh()  # the key stays in the tab
    row_css = f"#schedules tr[data-schedule='{sched['id']}']"
    _wait(driver, "the schedules list", lambda d: d.find_elements("css selector", row_css))
    _click(driver, row_css)
    _wait(driver, "its versions", lambda d: _rows(d, "versions"))
    [version] = _rows(driver, "versions")  # version, documents, tokens, shards, published, job, files
    assert [version[i] for i in (0, 1, 2, 3, 5)] == ["v1 (latest)", f"{job['documents']:,}", f"{job['tokens']:,}",
                                                      str(n), first[:8]]
    [run] = _rows(driver, "runs")  # run, slot, state, job, version, message
    assert [run[i] for i in (0, 2, 3, 4, 5)] == ["1", "succeeded", first[:8], "v1", "seeded"]
    _click(driver, f"#jobs tr[data-job='{second}']")
    _panel(driver, second)
    _click(driver, f"#runs button.link[data-job='{first}']")  # the run's job
    _panel(driver, first)
    _click(driver, "#versions button.files[data-version='1']")
    _wait(driver, "the version's files", lambda d: sorted(d.execute_script(
        "return [...document.querySelectorAll('#version-artifacts tbody tr')].map((tr) => tr.dataset.name)")) == listed)
    _click(driver, "#version-artifacts button.view[data-name='stats.json']")
    _wait(driver, "stats.json of v1", lambda d: d.find_element("css selector", "#version-artifacts pre.viewer")
          .get_attribute("data-name") == "stats.json")
    assert json.loads(driver.execute_script("return document.querySelector('#version-artifacts pre.viewer')"
                                            ".textContent")) == json.loads((out / "stats.json").read_text())
    _shot(driver, shots, "schedule.png")

    # pause, resume, delete: each after a confirmation
    _click(driver, "#schedule-pause")
    assert driver.find_element("id", "schedule-confirm").is_displayed()
    assert api.get(f"/v1/schedules/{sched['id']}").json()["paused"] is False  # nothing before the confirmation
    _click(driver, "#schedule-confirm-yes")
    _wait(driver, "paused", lambda d: d.find_element("id", "schedule-panel").get_attribute("data-paused") == "true")
    assert api.get(f"/v1/schedules/{sched['id']}").json()["paused"] is True
    _click(driver, "#schedule-resume")
    _click(driver, "#schedule-confirm-yes")
    _wait(driver, "resumed", lambda d: d.find_element("id", "schedule-panel").get_attribute("data-paused") == "false")
    _click(driver, "#schedule-delete")
    _click(driver, "#schedule-confirm-no")  # kept
    assert api.get(f"/v1/schedules/{sched['id']}").status_code == 200
    _click(driver, "#schedule-delete")
    _click(driver, "#schedule-confirm-yes")
    _wait(driver, "the schedule gone", lambda d: not d.find_element("id", "schedule-panel").is_displayed()
          and not _rows(d, "schedules"))
    assert api.get(f"/v1/schedules/{sched['id']}").status_code == 404
    said = sorted({activity for state, activity, _ in seen if state == "RUNNING"})
    print(f"screenshots: {shots}; what the running job said: {said}")
