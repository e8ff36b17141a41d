"""End to end: a short `spreeze train`, its dashboard opened in real headless Chromium.

Needs Debian's chromium and chromium-driver (.ci/run installs them); elsewhere the test
is skipped, but never in CI.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.test_integration import FAST, wait_for

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1400,2000"]
MAIN_CHARTS = ("eval_steps", "eval_time", "losses", "sampling", "updates", "utd", "replay", "stalls")

if not (CHROMIUM and DRIVER):
    if os.environ.get("CI"):
        raise RuntimeError("CI needs Debian's chromium and chromium-driver for the dashboard test (see .ci/run)")
    pytest.skip("chromium and chromedriver are not installed (apt-get install chromium chromium-driver)",
                allow_module_level=True)


def browser(profile: str):  # type: ignore[no-untyped-def]
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM  # type: ignore[assignment]
    for flag in [*CHROMIUM_FLAGS, f"--user-data-dir={profile}"]:
        opts.add_argument(flag)
    return webdriver.Chrome(options=opts, service=Service(DRIVER))


def page_state(driver) -> dict:  # type: ignore[no-untyped-def]
    return driver.execute_script("""
        const charts = {};
        document.querySelectorAll("canvas.chart").forEach(c => charts[c.dataset.chart] = +c.dataset.points);
        return {charts,
                health: [...document.querySelectorAll("#health tbody tr")].map(r => r.dataset.service),
                alive: [...document.querySelectorAll("#health tbody tr td:nth-child(3)")].map(td => td.className),
                events: [...document.querySelectorAll("#events li")].map(li => li.dataset.kind),
                video: document.getElementById("video").getAttribute("src"),
                note: document.getElementById("video-note").textContent,
                status: document.getElementById("status").textContent};
    """)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_dashboard_shows_a_live_run_in_chromium(tmp_path: Path) -> None:
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "spreeze.cli", "train", "--run-dir", str(run), *FAST, "--total-steps", "1000000",
           "eval.video_every=1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    profile = tempfile.mkdtemp(prefix="spz-chromium-")
    driver = None
    try:
        url = wait_for(lambda: p.read_text().strip() if (p := run / "dashboard.url").exists() else None, 120)
        assert url.startswith("http://127.0.0.1:")
        driver = browser(profile)
        driver.get(url)
        services = set(json.loads((run / "services.json").read_text()))
        assert {"replay", "learner", "evaluator", "sampler-0", "visualizer"} <= services

        def ready() -> dict | None:
            state = page_state(driver)
            charts_full = all(state["charts"].get(c, 0) > 0 for c in MAIN_CHARTS)
            told = state["video"] or state["note"] not in ("", "no video yet")
            return state if charts_full and set(state["health"]) == services and told else None

        state = wait_for(ready, 240)  # the first evaluation needs about 2,000 env steps
        alive = dict(zip(state["health"], state["alive"]))
        assert set(alive.values()) <= {"alive", "dead"} and alive["visualizer"] == "alive", state
        assert "dashboard" in state["events"], state
        assert state["status"].startswith("live")
        # it keeps updating without a reload: more sampling points arrive on the same page
        before = state["charts"]["sampling"]
        wait_for(lambda: True if page_state(driver)["charts"]["sampling"] > before else None, 60)
    finally:
        if driver is not None:
            driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out  # stopped by Ctrl-C
    assert f"dashboard: live dashboard at {url}" in out
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
