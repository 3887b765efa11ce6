"""WSGI entry point (gunicorn ledgerdash.wsgi)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ledgerdash.settings")

application = get_wsgi_application()

# Say so at start, with what to run, when the pages' static files are missing
# (deploy/gunicorn.conf.py goes further and refuses to start).
from ledgerdash.startup import warn_if_static_files_missing  # noqa: E402

warn_if_static_files_missing()

# What the apps load before the first request rather than in it (settings.WSGI_PRELOAD: the PDF
# renderer), named in the settings so this module imports no app of the dashboard.
from django.conf import settings  # noqa: E402
from django.utils.module_loading import import_string  # noqa: E402

for preload in settings.WSGI_PRELOAD:
    import_string(preload)()
