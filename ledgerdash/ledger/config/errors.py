"""What is wrong with a file, and where: a place in it is written as a key
path, as the file would spell it (``tenants.acme.policy.tools."mail.send"``,
``tenants.acme.on_call[0].ends_at``)."""

from __future__ import annotations

import json
import re

from django.core.exceptions import ValidationError

_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


class ConfigError(Exception):
    """Bad input: each problem's place in the file (a key path, or the file
    itself) and what is wrong there. ``where`` and ``message`` are the first's."""

    def __init__(self, where: str, message: str, *more: tuple[str, str]) -> None:
        self.problems = [(where, message), *more]
        super().__init__("\n".join(f"{at}: {what}" for at, what in self.problems))
        self.where = where
        self.message = message

    @classmethod
    def of(cls, problems: list[tuple[str, str]]) -> ConfigError:
        (where, message), *more = problems
        return cls(where, message, *more)


def key(name: str) -> str:
    """A key as TOML writes it: bare when it can be, else quoted."""
    return name if _BARE.match(name) else json.dumps(name, ensure_ascii=False)


def where_at(where: str, *keys: str | int) -> str:
    """The place ``keys`` further in from ``where`` (a number: an array's item)."""
    for part in keys:
        where = f"{where}[{part}]" if isinstance(part, int) else (f"{where}.{key(part)}" if where else key(part))
    return where


def first_error(exc: ValidationError) -> tuple[str | None, str]:
    """The field (None: the row as a whole) and message of a model's first complaint."""
    if hasattr(exc, "error_dict"):
        name, errors = next(iter(exc.message_dict.items()))
        return (None if name == "__all__" else name), "; ".join(errors)
    return None, "; ".join(exc.messages)
