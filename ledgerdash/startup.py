"""Checks a web process makes before it serves its first request.

A production deployment (DEBUG off) serves static files through whitenoise
from the hashed copies ``collectstatic`` writes, named by a manifest. Without
that manifest every page that links its stylesheet fails; better that the web
process refuses to start, saying what to run, than that it answers 500 to
every page. The deployment's gunicorn configuration refuses; a bare
``gunicorn ledgerdash.wsgi`` (the crash drill's API-only server, for one)
logs the same message as an error and serves on, since the API needs no
static files.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.contrib.staticfiles.storage import ManifestFilesMixin
from django.core.exceptions import ImproperlyConfigured
from django.core.files.storage import storages

log = logging.getLogger(__name__)

#: A file every page links: if the manifest names it, collectstatic ran with this code.
PROBE = "ledgerdash/app.css"

STATIC_NOT_COLLECTED = (
    "static files are not collected for DEBUG off: {why}. Run "
    "`DEBUG=false manage.py collectstatic --noinput` (with this deployment's environment, "
    "STATIC_ROOT={root}) before starting the web server; deploy/start-web does it for you."
)


def check_static_files() -> None:
    """Raise ImproperlyConfigured unless the hashed static files are in place."""
    storage = storages["staticfiles"]
    if not isinstance(storage, ManifestFilesMixin):
        return  # DEBUG on: files come straight from the app and the static/ folder
    root = settings.STATIC_ROOT
    if not storage.exists(storage.manifest_name):
        raise ImproperlyConfigured(STATIC_NOT_COLLECTED.format(why=f"{storage.manifest_name} is missing", root=root))
    try:
        storage.stored_name(PROBE)
    except ValueError:
        why = f"the manifest has no entry for {PROBE} (collected from an older version?)"
        raise ImproperlyConfigured(STATIC_NOT_COLLECTED.format(why=why, root=root)) from None


def warn_if_static_files_missing() -> None:
    try:
        check_static_files()
    except ImproperlyConfigured as exc:
        log.error("%s Until then every dashboard page answers 500; the API is not affected.", exc)
