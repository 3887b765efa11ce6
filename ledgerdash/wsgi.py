"""WSGI entry point (gunicorn ledgerdash.wsgi)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ledgerdash.settings")

application = get_wsgi_application()

# Say so at start, with what to run, when the pages' static files are missing
# (deploy/gunicorn.conf.py goes further and refuses to start).
from ledgerdash.startup import warn_if_static_files_missing  # noqa: E402

warn_if_static_files_missing()

# PDF reports: load the renderer now, not in a worker's first PDF request.
from reviews.audit_views import preload_pdf_renderer  # noqa: E402

preload_pdf_renderer()
