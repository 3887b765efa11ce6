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
# Email as production sends it (SMTP); Django's test runner puts its in-memory
# outbox in its place, and tests/test_notify.py runs a real SMTP server.
os.environ.setdefault("EMAIL_HOST", "127.0.0.1")
# Every request looks its token up (tests revoke and deactivate, then expect a
# refusal at once); tests/test_tokens.py turns the per-worker cache on itself.
os.environ.setdefault("LEDGER_TOKEN_CACHE_SECONDS", "0")
# Single sign-on on, against a provider tests/test_sso.py starts (its
# endpoints are set there); nothing listens at these until then.
os.environ.setdefault("OIDC_ENABLED", "true")
os.environ.setdefault("OIDC_OP_ISSUER", "http://127.0.0.1:9")
os.environ.setdefault("OIDC_OP_AUTHORIZATION_ENDPOINT", "http://127.0.0.1:9/authorize")
os.environ.setdefault("OIDC_OP_TOKEN_ENDPOINT", "http://127.0.0.1:9/token")
os.environ.setdefault("OIDC_OP_USER_ENDPOINT", "http://127.0.0.1:9/userinfo")
os.environ.setdefault("OIDC_OP_JWKS_ENDPOINT", "http://127.0.0.1:9/jwks")
os.environ.setdefault("OIDC_RP_CLIENT_ID", "ledgerdash-tests")
os.environ.setdefault("OIDC_RP_CLIENT_SECRET", "tests-only-client-secret")
os.environ.setdefault(
    "OIDC_GROUP_ROLES", "acme-ops=acme:operator,acme-leads=acme:approver,globex-all=globex:viewer,ops=nowhere:admin"
)

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
