"""The README's run command, as a newcomer uses it: a fresh database, the demo,
gunicorn + whitenoise on a port, a log-in, a page."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.live import ROOT, Browser, free_port, running

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("DATABASE_URL", "").startswith("postgres"), reason="the run command serves the embedded SQLite"
    ),
]


def test_the_run_command_serves_the_app_with_demo_data(tmp_path: Path) -> None:
    port = free_port()
    env = {"LEDGERDASH_VAR_DIR": str(tmp_path), "DEBUG": "true", "DATABASE_URL": ""}
    # The run command migrates and has real agents make the demo's calls before it serves; the
    # demo's crash drills run once the dashboard answers, their progress on the overview.
    with running(
        [str(ROOT / "scripts" / "run.sh"), "127.0.0.1", str(port)],
        env=env,
        url=f"http://127.0.0.1:{port}/login/",
        timeout=180,
    ):
        browser = Browser(f"http://127.0.0.1:{port}")
        status, _, _ = browser.get("/")
        assert status == 200  # the login page, after the redirect
        status, final_url = browser.login("operator", "ledgerdash-demo")
        assert status == 200
        assert final_url == f"http://127.0.0.1:{port}/"
        status, headers, page = browser.get("/")
        assert status == 200
        assert "UNKNOWN" in page
        assert "operator" in page
        assert "not verified" not in page  # the demo verifies its chains, as the nightly job would
        assert "Latest crash drills" in page
        # The reconciler starts once the drills are done; they never race its passes.
        pid_file = tmp_path / "reconciler.pid"
        deadline = time.monotonic() + 400
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(1)
        assert pid_file.exists(), (tmp_path / "demo.log").read_text()
        assert "the demo's crash drills are done: 27 of 27 cases held" in (tmp_path / "demo.log").read_text()
        status, headers, page = browser.get("/")
        assert "<progress" not in page  # no drill is running any more: the section stops polling
        assert "FAILED" not in page
        assert "not verified" not in page
        status, headers, css = browser.get("/static/ledgerdash/app.css")
        assert status == 200
        assert headers["Content-Type"].startswith("text/css")
        assert headers["Server"] == "gunicorn"
        assert "Cache-Control" in headers  # set by whitenoise, not by Django's static view
        assert ":root" in css
        # The reconciler is supervised: killed, it is started again.
        first = int(pid_file.read_text())
        os.kill(first, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            again = pid_file.read_text().strip()
            if again and int(again) != first:
                break
            time.sleep(0.2)
        second = int(pid_file.read_text())
        assert second != first
        os.kill(second, 0)  # alive
        assert "reconciler exited with status 137; restarting it" in (tmp_path / "reconciler.log").read_text()
    assert (tmp_path / "ledgerdash.sqlite3").exists()
    # The notification worker ran beside the reconciler.
    assert "sending notifications every" in (tmp_path / "notify.log").read_text()
