"""The Python client is a package of its own (clients/python): installed
into a fresh virtualenv it brings nothing but itself (no Django, no
WeasyPrint, none of the server), and an agent runs with it there."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "clients" / "python"

#: What ``import ledgerdash_client`` loads of the package, each module standard library only.
CLIENT_MODULES = {
    "ledgerdash_client",
    "ledgerdash_client.crashpoints",
    "ledgerdash_client.errorcodes",
    "ledgerdash_client.httpconn",
    "ledgerdash_client.keys",
    "ledgerdash_client.outcomes",
    "ledgerdash_client.toolcalls",
}

AGENT = textwrap.dedent(
    """
    import sys

    class OnlyTheStandardLibrary:
        # Refuses every module outside the standard library and the client: django, weasyprint, the server...
        def find_spec(self, name, path=None, target=None):
            top = name.partition(".")[0]
            if top not in sys.stdlib_module_names and top != "ledgerdash_client":
                raise ImportError(f"the client imported {name}")
            return None

    sys.meta_path.insert(0, OnlyTheStandardLibrary())

    import ledgerdash_client as ledger
    from ledgerdash_client import IdempotencyConflict, LedgerClient, NothingHappened

    @ledger.tool("send_email", key="invoice:{invoice_id}:send")
    def send_email(call, *, invoice_id):
        raise AssertionError("never called: no ledger answers")

    api = LedgerClient("http://127.0.0.1:9", "token", retries=0, timeout=1)
    exc = ledger.error_for(409, {"code": "idempotency_key_reused", "message": "m", "original_id": 3})
    assert isinstance(exc, IdempotencyConflict) and exc.original_id == 3
    assert issubclass(NothingHappened, Exception)
    try:
        with ledger.task(task_id="t", client=api):
            send_email(invoice_id="INV-7")
    except ledger.LedgerUnavailable as unreachable:
        assert unreachable.sent is False
    else:
        raise AssertionError("the closed port answered")
    print(" ".join(sorted(m for m in sys.modules if m.split(".")[0] == "ledgerdash_client")))
    """
)


def _run_agent(python: str | Path, cwd: Path) -> set[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "PYTHONPATH")}
    done = subprocess.run(
        [str(python), "-c", AGENT], cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


def test_the_client_imports_and_runs_without_the_server() -> None:
    assert _run_agent(sys.executable, ROOT) == CLIENT_MODULES


#: The Pythons the client supports (clients/python/pyproject.toml), oldest first.
SUPPORTED = ("3.10", "3.11", "3.12", "3.13")


def _interpreter(version: str) -> str | None:
    """An interpreter of ``version``: this one, one pyenv installed, or one on ``PATH`` (not a pyenv
    shim, which answers only for the versions pyenv was told to use)."""
    if f"{sys.version_info.major}.{sys.version_info.minor}" == version:
        return sys.executable
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    for candidate in sorted(root.glob(f"{version}.*"), reverse=True):
        if (candidate / "bin" / "python").exists():
            return str(candidate / "bin" / "python")
    found = shutil.which(f"python{version}")
    return found if found and "/shims/" not in found else None


def test_the_client_says_the_oldest_python_it_supports() -> None:
    assert 'requires-python = ">=3.10"' in (PACKAGE / "pyproject.toml").read_text()


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("DATABASE_URL", "").startswith("postgres"), reason="runs in the SQLite pass (no database)"
)
@pytest.mark.parametrize("version", SUPPORTED)
def test_pip_installs_the_client_alone_into_a_fresh_virtualenv(tmp_path: Path, version: str) -> None:
    """``pip install ./clients/python`` with each Python the client supports: the client and nothing
    else, and an agent runs with it."""
    interpreter = _interpreter(version)
    if interpreter is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"no Python {version} here (PATH or pyenv): the client must be tried on each it supports")
        pytest.skip(f"no Python {version} here (PATH or pyenv)")
    env_dir = tmp_path / "agent-env"
    subprocess.run([interpreter, "-m", "venv", str(env_dir)], check=True, timeout=300)
    python = env_dir / "bin" / "python"
    before = _installed(python)
    # A copy: building writes beside the sources (build/, egg-info), which is not the checkout's business.
    source = tmp_path / "ledgerdash-client"
    shutil.copytree(PACKAGE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    installed = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", str(source)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert installed.returncode == 0, installed.stderr
    assert _installed(python) - before == {"ledgerdash-client"}
    # Run from outside the checkout: what the agent imports is the installed package.
    assert _run_agent(python, tmp_path) == CLIENT_MODULES


def _installed(python: Path) -> set[str]:
    listed = subprocess.run(
        [str(python), "-m", "pip", "list", "--format", "freeze"], capture_output=True, text=True, check=True
    )
    return {line.split("==")[0].lower() for line in listed.stdout.split() if "==" in line}
