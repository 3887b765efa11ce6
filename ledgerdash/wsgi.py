"""WSGI entry point (gunicorn ledgerdash.wsgi)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ledgerdash.settings")

application = get_wsgi_application()
