"""gunicorn's logger (ledgerdash/ops/logs.py): a request's access-log line is
built and written only when an access log is kept (``GUNICORN_ACCESS_LOG``)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from gunicorn.config import Config

from ledgerdash.ops.logs import GunicornLogger, gunicorn_config


@pytest.fixture(autouse=True)
def logging_as_it_was() -> Iterator[None]:
    """gunicorn's logger applies its ``logconfig_dict`` to the process's logging: put the root back."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def _logger(access: str | None) -> GunicornLogger:
    cfg = Config()
    cfg.set("accesslog", access)
    cfg.set("logconfig_dict", gunicorn_config("plain", "info", access=access))
    return GunicornLogger(cfg)


def test_without_an_access_log_no_line_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    logger = _logger(None)

    def atoms(*args: Any) -> dict[str, str]:
        raise AssertionError("the access-log line was built")

    monkeypatch.setattr(logger, "atoms", atoms)
    logger.access(None, None, {}, None)


def test_with_an_access_log_each_request_is_written(monkeypatch: pytest.MonkeyPatch) -> None:
    logger = _logger("-")
    written: list[str] = []
    monkeypatch.setattr(logger, "atoms", lambda *args: {"h": "127.0.0.1", "r": "POST /api/v1/attempts HTTP/1.1"})
    monkeypatch.setattr(logger.access_log, "info", lambda fmt, atoms: written.append(fmt % atoms))
    logger.access(None, None, {}, None)
    assert len(written) == 1
    assert "POST /api/v1/attempts" in written[0]
