"""WSGI entry point (gunicorn ledgerdash.wsgi)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ledgerdash.settings")

application = get_wsgi_application()

# PDF reports: load the renderer now, not in a worker's first PDF request.
from reviews.audit_views import preload_pdf_renderer  # noqa: E402

preload_pdf_renderer()
