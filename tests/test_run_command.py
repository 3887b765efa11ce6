"""The README's run command, as a newcomer uses it: a fresh database, the demo,
gunicorn + whitenoise on a port, a log-in, a page; then every example the
first-hour pages show, run as written against that demo
(:mod:`tests.newcomer_examples`)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import newcomer_examples
from tests.live import DOC_SHOTS, DOC_SHOTS_DIR, ROOT, Browser, free_port, running

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("DATABASE_URL", "").startswith("postgres"), reason="the run command serves the embedded SQLite"
    ),
]


@dataclass
class Demo:
    port: int
    var_dir: Path
    workdir: Path

    @property
    def sandbox_port(self) -> int:
        return self.port + 100  # run.sh's default

    def drills_done(self) -> None:
        """Wait for the demo's crash drills (the reconciler starts once they are done)."""
        deadline = time.monotonic() + 400
        while not (self.var_dir / "reconciler.pid").exists() and time.monotonic() < deadline:
            time.sleep(1)
        assert (self.var_dir / "reconciler.pid").exists(), (self.var_dir / "demo.log").read_text()

    def examples(self, page: str) -> str:
        return newcomer_examples.run(
            page,
            workdir=self.workdir,
            port=self.port,
            sandbox_port=self.sandbox_port,
            var_dir=self.var_dir,
        )

    def effects(self, key: str) -> int:
        url = f"http://127.0.0.1:{self.sandbox_port}/effects/count?key={urllib.parse.quote(key)}"
        with urllib.request.urlopen(url, timeout=10) as answer:
            return int(json.load(answer)["count"])


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    """``scripts/run.sh`` on a port of its own (the sandbox on that port + 100), a fresh var directory."""
    var_dir = tmp_path_factory.mktemp("var")
    port = free_port()
    while not free_port_is(port + 100):
        port = free_port()
    env = {"LEDGERDASH_VAR_DIR": str(var_dir), "DEBUG": "true", "DATABASE_URL": ""}
    # The run command migrates and has real agents make the demo's calls before it serves; the
    # demo's crash drills run once the dashboard answers, their progress on the overview.
    with running(
        [str(ROOT / "scripts" / "run.sh"), "127.0.0.1", str(port)],
        env=env,
        url=f"http://127.0.0.1:{port}/login/",
        timeout=180,
    ):
        yield Demo(port, var_dir, tmp_path_factory.mktemp("newcomer"))


def free_port_is(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_the_run_command_serves_the_app_with_demo_data(demo: Demo) -> None:
    port, tmp_path = demo.port, demo.var_dir
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
    demo.drills_done()
    pid_file = tmp_path / "reconciler.pid"
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


# --- every example of the first-hour pages, as written, against the same demo ------------------


def test_every_fenced_block_of_the_first_hour_pages_is_run_or_says_it_is_a_reference() -> None:
    for page in newcomer_examples.PAGES:
        for info, _ in newcomer_examples.fences(page):
            words = info.split()
            if words and words[0] in newcomer_examples.PICTURES:
                continue
            assert len(words) >= 2, f"{page}: a fenced block must say demo (run by this test) or reference: {info!r}"
            assert words[1] in newcomer_examples.KINDS, f"{page}: {info!r}"
    runnable = {page: newcomer_examples.examples(page) for page in newcomer_examples.PAGES}
    for page in ("README.md", "docs/agents.md", "docs/api.md", "docs/recovery.md"):
        assert runnable[page].commands, f"{page} shows nothing to run against the demo"


def test_the_readmes_in_process_agent_sends_once_and_replays(demo: Demo) -> None:
    demo.drills_done()
    demo.examples("README.md")
    assert demo.effects("invoice:INV-21:send") == 1


def test_the_agents_guides_typescript_and_framework_agents_send_once(demo: Demo) -> None:
    demo.drills_done()
    output = demo.examples("docs/agents.md")
    assert demo.effects("invoice:INV-19:send") == 1  # TypeScript, run twice
    assert demo.effects("invoice:INV-20:send") == 1  # LangChain through the adapter, with name=
    assert "added 1 package" in output  # the client installed from the checkout's folder, no registry


def test_the_api_guides_curl_python_and_approver_examples(demo: Demo) -> None:
    demo.drills_done()
    output = demo.examples("docs/api.md")
    assert demo.effects("invoice:INV-17:send") == 1  # curl: recorded, claimed, sent, confirmed
    assert demo.effects("invoice:INV-18:send") == 1  # the Python client, run twice
    assert '"state":"OUTCOME_CONFIRMED"' in output
    assert '"state":"FAILED"' in output  # the approver's rejection
    assert "rejected by approver via token" in output


def test_the_crash_walk_of_the_recovery_guide(demo: Demo) -> None:
    demo.drills_done()
    output = demo.examples("docs/recovery.md")
    assert "the agent died (exit status 9)" in output
    assert "not sent again: " in output
    assert "settled: OUTCOME_CONFIRMED eff_" in output
    assert demo.effects("invoice:INV-22:send") == 1


def test_every_screenshot_the_docs_show_is_one_a_browser_test_takes() -> None:
    """A picture in the docs is made by `make screenshots` (the browser tests), never by hand."""
    shown = set()
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        shown |= set(re.findall(r"\]\((?:docs/)?screenshots/([\w-]+)\.png\)", page.read_text()))
    assert shown == DOC_SHOTS
    assert {path.stem for path in DOC_SHOTS_DIR.glob("*.png")} == DOC_SHOTS
    taken = set(
        re.findall(r'\.shot\("([\w-]+)"\)', "".join(p.read_text() for p in ROOT.glob("tests/test_browser*.py")))
    )
    assert taken >= DOC_SHOTS
