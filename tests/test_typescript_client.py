"""The TypeScript client (clients/typescript): its generated files are current,
its own tests pass under Node's test runner, and against a live server an
agent in Node, killed after its dispatch, never repeats the effect.

Without Node these are skipped, with the reason; under CI they fail.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from ledgerdash.ledger.models import Attempt, State, Tenant
from ledgerdash.ledger.reconciler import Reconciler
from tests.api_support import issue_token
from tests.conftest import IN_CI
from tests.live import ROOT
from tests.sandboxes import Sandbox

CLIENT = ROOT / "clients" / "typescript"
NODE = shutil.which("node")


def _node() -> str:
    if NODE is None:
        if IN_CI:
            pytest.fail("node is not installed; CI must run the TypeScript client's tests")
        pytest.skip("node is not installed: the TypeScript client's tests need Node 20 or newer")
    return NODE


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location("typescript_client", ROOT / "scripts" / "typescript_client.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_generated_types_and_errors_are_up_to_date() -> None:
    for path, text in _generator().generated().items():
        assert path.read_text(encoding="utf-8") == text, (
            f"{path.relative_to(ROOT)} is out of date: run DEBUG=true .venv/bin/python scripts/typescript_client.py"
        )


def test_every_error_code_has_a_class_in_both_clients() -> None:
    import ledgerdash_client as client

    errors_js = (CLIENT / "src" / "errors.js").read_text()
    assert set(re.findall(r'static code = "([a-z0-9_]+)"', errors_js)) == set(client.ERRORS)


def test_the_package_has_no_runtime_dependencies() -> None:
    import json

    package = json.loads((CLIENT / "package.json").read_text())
    assert package.get("dependencies", {}) == {}
    assert "devDependencies" not in package


#: A value (not a type) a declaration file promises: a const, function or class.
DECLARED_VALUE = re.compile(r"^export declare (?:const|function|class) (\w+)", re.M)
#: A method a declared class promises (instance fields are set by its constructor, not checked here).
DECLARED_METHOD = re.compile(r"^  (?:static )?(?:async )?(\w+)[(<]", re.M)

CHECK_EXPORTS = """
const declared = process.argv.at(-1);
const want = JSON.parse(declared);
const module = await import("./src/index.js");
const missing = [];
for (const [name, members] of Object.entries(want)) {
  if (!(name in module)) { missing.push(name); continue; }
  const value = module[name];
  for (const member of members) {
    const found = typeof value === "function" && (member in value || member in (value.prototype ?? {}));
    if (!found) missing.push(`${name}.${member}`);
  }
}
console.log(JSON.stringify(missing));
"""


def _declared() -> dict[str, list[str]]:
    """Every value the .d.ts files promise, with each declared class's members."""
    want: dict[str, list[str]] = {}
    for path in sorted((CLIENT / "src").glob("*.d.ts")):
        text = path.read_text()
        for match in DECLARED_VALUE.finditer(text):
            members: list[str] = []
            line_end = text.index("\n", match.end())
            is_class = text[match.start() :].startswith(f"export declare class {match.group(1)}")
            if is_class and not text[match.end() : line_end].rstrip().endswith("{}"):
                body = text[line_end : text.index("\n}", line_end)]
                members = [m for m in DECLARED_METHOD.findall(body) if m != "constructor"]
            want[match.group(1)] = members
    return want


def test_what_the_declarations_promise_the_javascript_exports() -> None:
    """The .d.ts files are written by hand beside the JavaScript: every
    const, function and class they declare, and every member of a declared
    class, exists in what ``import "@ledgerdash/client"`` gives."""
    import json

    declared = _declared()
    assert {"LedgerClient", "ToolCall", "Task", "errorFor", "formatKey"} <= set(declared)
    assert "dispatch" in declared["LedgerClient"]
    result = subprocess.run(
        [_node(), "--input-type=module", "-e", CHECK_EXPORTS, "--", json.dumps(declared)],
        cwd=CLIENT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout) == []


def test_the_clients_own_tests_pass_under_nodes_test_runner() -> None:
    result = subprocess.run(
        [_node(), "--test", "test/client.test.mjs"], cwd=CLIENT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert re.search(r"^# fail 0$", result.stdout, re.M)


@pytest.mark.postgres
@pytest.mark.slow
def test_an_agent_in_node_killed_after_dispatch_never_repeats_the_effect(
    live_server: Any, tenant_a: Tenant, sandbox_tools: Sandbox
) -> None:
    node = _node()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "LEDGERDASH_"))}
    env.update(LEDGERDASH_URL=live_server.url, LEDGERDASH_TOKEN=issue_token(tenant_a), SANDBOX_URL=sandbox_tools.url)
    result = subprocess.run(
        [node, "--test", "test/live.test.mjs"], cwd=CLIENT, env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert re.search(r"^# pass 3$", result.stdout, re.M), result.stdout[-3000:]
    assert re.search(r"^# skipped 0$", result.stdout, re.M)

    # Recovery settles the killed agent's attempt from the provider; the restarted agent is told, not sent again.
    invoice = re.search(r"LEDGERDASH-E2E dispatched (\S+)", result.stdout)
    assert invoice, result.stdout[-3000:]
    attempt = Attempt.objects.get(idempotency_key=f"invoice:{invoice.group(1)}:send")
    assert attempt.state == State.DISPATCHED
    Attempt.objects.filter(pk=attempt.pk).update(next_check_at=timezone.now() - timedelta(seconds=1))
    Reconciler(label="ts-e2e").run_pass()
    attempt.refresh_from_db()
    assert attempt.state == State.OUTCOME_CONFIRMED
    rerun = subprocess.run(
        [node, "e2e/agent.mjs"],
        cwd=CLIENT,
        env={**env, "E2E_INVOICE": invoice.group(1)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert rerun.returncode == 0, rerun.stderr
    assert '"raised"' not in rerun.stdout
    assert sandbox_tools.count(attempt.provider_key) == 1


def test_the_package_installs_into_an_agents_project_as_the_docs_say(tmp_path: Path) -> None:
    """docs/agents.md: `npm install /path/to/ledgerdash/clients/typescript`, then import it."""
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed")
    project = tmp_path / "agent"
    project.mkdir()
    (project / "package.json").write_text('{"name": "agent", "version": "1.0.0", "type": "module"}')
    assert "npm install /path/to/ledgerdash/clients/typescript" in (ROOT / "docs" / "agents.md").read_text()
    installed = subprocess.run(
        [npm, "install", "--offline", "--no-audit", "--no-fund", str(CLIENT)],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert installed.returncode == 0, installed.stderr
    imported = subprocess.run(
        [_node(), "-e", 'import("@ledgerdash/client").then((m) => console.log(typeof m.LedgerClient, m.ENV_URL))'],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert imported.stdout.split() == ["function", "LEDGERDASH_URL"], imported.stderr
