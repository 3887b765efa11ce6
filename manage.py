#!/usr/bin/env python
"""Django's command-line utility for ledgerdash."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ledgerdash.settings")
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:
        settings.INSTALLED_APPS  # noqa: B018 - loads the settings, which check the environment
    except ImproperlyConfigured as exc:
        # A setting the environment got wrong: say which, in one line, for any command (--help too).
        sys.exit(f"manage.py: ImproperlyConfigured: {exc}")
    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
