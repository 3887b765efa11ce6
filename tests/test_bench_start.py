"""How the benchmarks start the servers they measure."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest


def test_the_benchmarks_gunicorn_is_this_interpreters_whatever_else_the_checkout_has(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fresh clone has only the benchmark's environment: the server must come from it, not from
    .venv (made only by `make venv`) nor from whatever gunicorn is on PATH."""
    from bench import common

    started: list[list[str]] = []

    class Started(Exception):
        pass

    def popen(cmd: list[str], **options: Any) -> None:
        started.append(cmd)
        raise Started

    monkeypatch.setattr(common, "run_manage", lambda *args, **kwargs: "")
    monkeypatch.setattr(subprocess, "Popen", popen)
    with pytest.raises(Started):
        common.start_gunicorn("postgres://nowhere/none")
    assert started[0][:3] == [sys.executable, "-m", "gunicorn"]
