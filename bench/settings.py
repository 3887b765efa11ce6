"""The project's settings with the queue benchmark's URLconf (bench/urls.py):
used only by the gunicorn the queue benchmark starts."""

from ledgerdash.settings import *  # noqa: F403

ROOT_URLCONF = "bench.urls"
