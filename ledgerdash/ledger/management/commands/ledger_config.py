"""Configuration as code: tenants, policies, tools, members, on-call shifts,
credential bindings and notifications from one TOML file.

    manage.py ledger_config plan deploy/ledger.example.toml   # what would change; writes nothing
    manage.py ledger_config apply deploy/ledger.example.toml  # exactly those changes, in one transaction
    manage.py ledger_config export [FILE]                     # the configuration now (no FILE: standard output)

Every change is an event in the affected tenant's chain, made by
``system manage.py ledger_config``. Nothing is ever deleted, and no secret
is ever in the file. See docs/configuration.md and
:mod:`ledgerdash.ledger.config`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledgerdash.ledger import config


class Command(BaseCommand):
    help = "Plan, apply or export the configuration (tenants, policies, tools, people, notifications) as TOML."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["plan", "apply", "export"])
        parser.add_argument("file", nargs="?", help="the TOML file (export: where to write; default standard output)")

    def handle(self, *args: Any, **options: Any) -> None:
        action, path = options["action"], options["file"]
        if action == "export":
            try:
                text = config.export()
            except config.ConfigError as exc:
                raise CommandError(f"cannot export: {exc}") from None
            if path and path != "-":
                Path(path).write_text(text, encoding="utf-8")
                self.stderr.write(f"configuration written to {path}")
            else:
                self.stdout.write(text, ending="")
            return
        if not path:
            raise CommandError(f"{action} needs the file: manage.py ledger_config {action} FILE")
        try:
            desired = config.parse_file(path)
            shown: list[str] = []
            if action == "plan":
                plan = config.make_plan(desired)
            else:
                plan, shown = config.apply(desired)
        except config.ConfigError as exc:
            raise CommandError(_refusal(exc)) from None
        for line in plan.lines():
            self.stdout.write(line)
        if action == "apply":
            self.stdout.write(self.style.SUCCESS("applied") if plan.changes else "nothing to apply")
            for line in shown:
                self.stdout.write(line)


def _refusal(exc: config.ConfigError) -> str:
    """What is wrong with the file: one problem on its line, several one a line."""
    if len(exc.problems) == 1:
        return f"{exc} (nothing was written)"
    lines = "".join(f"\n  {where}: {message}" for where, message in exc.problems)
    return f"{len(exc.problems)} problems in the file (nothing was written):{lines}"
