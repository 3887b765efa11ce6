"""The static files app, leaving out what no page serves.

django-ninja ships Swagger UI (``/api/v1/docs``) and ReDoc, each with its source map: about
8 MB that ``collectstatic`` would hash and compress (gzip and brotli) at every first start of a
web process. The API docs use Swagger UI alone, so ReDoc stays in the package; Swagger UI's
maps are collected, since its files name them, but not compressed (settings'
``WHITENOISE_SKIP_COMPRESS_EXTENSIONS``).
"""

from __future__ import annotations

from django.contrib.staticfiles.apps import StaticFilesConfig


class StaticFiles(StaticFilesConfig):
    ignore_patterns = [*StaticFilesConfig.ignore_patterns, "redoc.standalone.js", "redoc.standalone.js.map"]
