"""Environment defaults for the test suite, then the project's one settings module.

Tests run with DEBUG off, as production does; only what a test run cannot
provide (a secret, TLS) is filled in here.
"""

import os
import tempfile
from pathlib import Path

os.environ.setdefault("DEBUG", "false")
os.environ.setdefault("SECRET_KEY", "tests-only-" + "k" * 50)
os.environ.setdefault("SECURE_SSL_REDIRECT", "false")
os.environ.setdefault("SECURE_COOKIES", "false")
os.environ.setdefault("ALLOWED_HOSTS", "testserver,127.0.0.1,localhost")

from ledgerdash.settings import *  # noqa: F403

STORAGES = {
    **STORAGES,  # noqa: F405
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# Tests serve static files from the finders, as DEBUG does; an empty
# STATIC_ROOT that exists keeps whitenoise from warning about a missing one.
WHITENOISE_USE_FINDERS = True
STATIC_ROOT = Path(tempfile.gettempdir()) / "ledgerdash-test-static"
STATIC_ROOT.mkdir(exist_ok=True)
