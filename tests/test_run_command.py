"""The README's run command, as a newcomer uses it: a fresh database, the demo,
gunicorn + whitenoise on a port, a log-in, a page; then every example the
first-hour pages show, run as written against that demo
(:mod:`tests.newcomer_examples`)."""

from __future__ import annotations

import json
import os
import re
import shutil
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
    # One demo serves every test here: on one worker, not one demo per worker.
    pytest.mark.xdist_group("make-run-demo"),
    pytest.mark.skipif(
        os.environ.get("DATABASE_URL", "").startswith("postgres"), reason="the run command serves the embedded SQLite"
    ),
]


#: /metrics for the Grafana dashboard's test (the demo serves it only with a token).
METRICS_TOKEN = "grafana-test-" + "x" * 16
GRAFANA = ROOT / "deploy" / "grafana"


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
    env = {"LEDGERDASH_VAR_DIR": str(var_dir), "DEBUG": "true", "DATABASE_URL": "", "METRICS_TOKEN": METRICS_TOKEN}
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
    assert demo.effects("invoice:INV-24:send") == 1  # an MCP client through the gateway, twice
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


# --- the Grafana dashboard's every query, against a real Prometheus scraping the demo ------------


def panel_queries() -> list[tuple[str, str]]:
    dashboard = json.loads((GRAFANA / "dashboards" / "ledgerdash.json").read_text())
    return [(panel["title"], target["expr"]) for panel in dashboard["panels"] for target in panel["targets"]]


def test_the_grafana_dashboard_is_provisioned_from_its_files() -> None:
    dashboard = json.loads((GRAFANA / "dashboards" / "ledgerdash.json").read_text())
    source = (GRAFANA / "provisioning" / "datasources" / "ledgerdash.yaml").read_text()
    uids = {panel["datasource"]["uid"] for panel in dashboard["panels"]}
    uids |= {t["datasource"]["uid"] for panel in dashboard["panels"] for t in panel["targets"]}
    assert uids == {"ledgerdash-prometheus"}
    assert "uid: ledgerdash-prometheus" in source
    assert len({panel["id"] for panel in dashboard["panels"]}) == len(dashboard["panels"])
    assert "type: file" in (GRAFANA / "provisioning" / "dashboards" / "ledgerdash.yaml").read_text()
    # What docs/production.md says it shows, it shows.
    titles = " ".join(panel["title"].lower() for panel in dashboard["panels"])
    for word in ("waiting", "oldest", "reconciler", "decisions", "incidents", "notification", "chains", "latency"):
        assert word in titles


def test_every_grafana_panel_query_returns_data_from_a_prometheus_scraping_the_demo(demo: Demo, tmp_path: Path) -> None:
    prometheus = shutil.which("prometheus")
    assert prometheus, "Debian's prometheus package: scripts/promtool.sh installs it (make test does)"
    demo.drills_done()  # the reconciler's passes and decisions are in the ledger
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: ledgerdash\n"
        f"    authorization: {{type: Bearer, credentials: {METRICS_TOKEN}}}\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{demo.port}']}}]\n"
    )
    command = [
        prometheus,
        f"--config.file={config}",
        f"--storage.tsdb.path={tmp_path / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    with running(command, url=f"http://127.0.0.1:{port}/-/ready", timeout=60):
        queries = panel_queries()
        empty: list[str] = queries_without_data(port, queries)
        deadline = time.monotonic() + 90  # enough scrapes for every rate() and increase()
        while empty and time.monotonic() < deadline:
            time.sleep(2)
            empty = queries_without_data(port, queries)
        assert empty == [], "panels whose query returned nothing from the live ledger"
        assert query(port, 'up{job="ledgerdash"}') == [1.0]


def query(port: int, expr: str) -> list[float]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as answer:
        body = json.load(answer)
    assert body["status"] == "success", body
    result = body["data"]["result"]
    if body["data"]["resultType"] == "scalar":
        return [float(result[1])]
    return [float(sample["value"][1]) for sample in result]


def queries_without_data(port: int, queries: list[tuple[str, str]]) -> list[str]:
    return [f"{title}: {expr}" for title, expr in queries if not query(port, expr)]
