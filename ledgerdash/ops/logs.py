"""What every process logs, and how: one shape for the app, gunicorn and the workers.

``LOG_FORMAT=json`` makes every line a JSON object (``time``, ``level``,
``logger``, ``message``, and what the line carries); ``plain`` (the
default) is for a person at a terminal. The settings (``LOGGING``) and
gunicorn's configuration (``deploy/gunicorn.conf.py``) both take their
formatter from here, so gunicorn's own lines match the app's.

A request is logged once, by :class:`ledgerdash.ops.requests.RequestLogMiddleware`,
with its request id; every other line written while it is served carries
the same ``request_id`` (:class:`RequestIdFilter`). Django's own
``django.request`` lines repeat the request line for every 4xx and 5xx
answer; only those with a traceback (an uncaught exception, which nothing
else logs) are kept (:class:`TracebacksOnly`).
"""

from __future__ import annotations

import contextvars
import logging
from typing import Any

from gunicorn import glogging

#: The request being served by this thread (or task), for the lines written meanwhile.
current_request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)

FORMATS = ("plain", "json")


def formatter(log_format: str) -> dict[str, Any]:
    """The ``logging.config`` formatter for ``log_format`` (``plain`` or ``json``)."""
    if log_format == "json":
        return {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "format": "%(asctime)s %(levelname)s %(name)s %(message)s",
            "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger"},
        }
    return {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}


def first_line(exc: BaseException) -> str:
    """An error's first line (a database error's message runs on with context lines)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class RequestIdFilter(logging.Filter):
    """Give every line written while a request is served that request's id."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            rid = current_request_id.get()
            if rid is not None:
                record.request_id = rid
        return True


class TracebacksOnly(logging.Filter):
    """Keep a line only when it carries a traceback (for ``django.request``,
    whose other lines repeat what the request line says)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.exc_info is not None


class NotFontSubsetting(logging.Filter):
    """Drop WeasyPrint's note that it subsets fonts with fontTools for want of
    HarfBuzz-Subset (a library Debian 12 does not package): the PDF is the
    same, and a worker would otherwise print it for each font as it starts."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "instead of HarfBuzz-Subset" not in record.getMessage()


def config(log_format: str, level: str) -> dict[str, Any]:
    """The ``LOGGING`` dictionary of a process."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {log_format: formatter(log_format)},
        "filters": {
            "request_id": {"()": "ledgerdash.ops.logs.RequestIdFilter"},
            "tracebacks_only": {"()": "ledgerdash.ops.logs.TracebacksOnly"},
            "not_font_subsetting": {"()": "ledgerdash.ops.logs.NotFontSubsetting"},
        },
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": log_format, "filters": ["request_id"]}},
        "root": {"handlers": ["console"], "level": level.upper()},
        "loggers": {
            "django.db.backends": {"level": "WARNING"},
            "django.request": {"filters": ["tracebacks_only"]},
            # WeasyPrint reports each step of every PDF it renders (a worker renders one as it starts).
            "weasyprint": {"level": "WARNING", "filters": ["not_font_subsetting"]},
            "fontTools": {"level": "WARNING"},
        },
    }


def gunicorn_config(log_format: str, level: str, *, access: str | None) -> dict[str, Any]:
    """gunicorn's ``logconfig_dict``: its own lines (start, workers, signals) in the app's format;
    its access log only when ``access`` names where (``-``: standard output), since the app logs
    each request itself."""
    handlers: dict[str, Any] = {
        "gunicorn_console": {"class": "logging.StreamHandler", "formatter": log_format, "stream": "ext://sys.stderr"}
    }
    if access == "-":
        handlers["gunicorn_access"] = {
            "class": "logging.StreamHandler",
            "formatter": log_format,
            "stream": "ext://sys.stdout",
        }
    elif access:
        handlers["gunicorn_access"] = {"class": "logging.FileHandler", "formatter": log_format, "filename": access}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {log_format: formatter(log_format)},
        "handlers": handlers,
        "loggers": {
            "gunicorn.error": {"level": level.upper(), "handlers": ["gunicorn_console"], "propagate": False},
            "gunicorn.access": {
                "level": "INFO" if access else "CRITICAL",
                "handlers": ["gunicorn_access"] if access else [],
                "propagate": False,
            },
        },
        # the app configures the root logger itself (LOGGING) once gunicorn has loaded it
        "root": {"level": level.upper(), "handlers": []},
    }


class GunicornLogger(glogging.Logger):
    """gunicorn's logger, which builds a request's access-log line only when
    an access log is kept (``GUNICORN_ACCESS_LOG``).

    gunicorn takes a ``logconfig_dict`` (which :func:`gunicorn_config` always
    gives) to mean an access log may be kept, and builds every request's
    line (its atoms: headers, times, sizes) before handing it to a logger
    that drops it: 2% of a worker's time serving agents."""

    def access(self, resp: Any, req: Any, environ: Any, request_time: Any) -> None:
        if self.cfg.accesslog:
            super().access(resp, req, environ, request_time)


class LoggedChecks:
    """A mixin for the commands services run (the workers, ``verify_audit``,
    ``backup_ledger``): with ``LOG_FORMAT=json`` what the system checks find
    is written as log lines (``check``, ``object``, ``hint`` beside the
    message) instead of Django's plain block, and a serious finding stops
    the command with exit status 1 after an error line, so every line the
    process writes is JSON. With ``plain`` Django prints its block as usual."""

    def check(self, *args: Any, **kwargs: Any) -> None:
        from django.conf import settings
        from django.core import checks

        if getattr(settings, "LOG_FORMAT", "plain") != "json":
            super().check(*args, **kwargs)  # type: ignore[misc]
            return
        names = ("app_configs", "tags", "display_num_errors", "include_deployment_checks", "fail_level", "databases")
        options = dict(zip(names, args, strict=False)) | kwargs
        issues = [
            issue
            for issue in checks.run_checks(
                app_configs=options.get("app_configs"),
                tags=options.get("tags"),
                include_deployment_checks=options.get("include_deployment_checks", False),
                databases=options.get("databases"),
            )
            if not issue.is_silenced()
        ]
        log = logging.getLogger("django.checks")
        for issue in issues:
            level = logging.ERROR if issue.is_serious() else logging.WARNING
            log.log(
                level,
                "%s: %s",
                issue.id,
                issue.msg,
                extra={"check": issue.id, "object": str(issue.obj) if issue.obj else None, "hint": issue.hint},
            )
        serious = [issue.id for issue in issues if issue.level >= options.get("fail_level", checks.ERROR)]
        if serious:
            log.error("system checks failed (%s): not starting", ", ".join(str(i) for i in serious))
            raise SystemExit(1)
