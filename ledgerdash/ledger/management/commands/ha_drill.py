"""``manage.py ha_drill``: the failover drill (see ledgerdash.ha.drill)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledgerdash.ha.cluster import ClusterError, missing_programs
from ledgerdash.ha.drill import FailoverDrill, scratch


class Command(BaseCommand):
    help = (
        "Run the ledger under load on a PostgreSQL cluster of its own (Patroni, etcd, a synchronous standby), "
        "kill the primary, then freeze the next one; print what was lost, duplicated or left stuck."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--http-agents", type=int, default=2)
        parser.add_argument("--process-agents", type=int, default=2)
        parser.add_argument("--load-seconds", type=float, default=5.0, help="load before, between and after the faults")
        parser.add_argument("--keep", type=Path, help="a folder to keep the cluster's and processes' logs in")

    def handle(self, *args: Any, **options: Any) -> None:
        missing = missing_programs()
        if missing:
            packages = " ".join(missing)
            raise CommandError(f"the failover drill needs Debian's {packages}: apt-get install {packages}")

        def say(line: str) -> None:
            self.stdout.write(line)

        def drill(workdir: Path) -> bool:
            verdict = FailoverDrill(
                workdir,
                http_agents=options["http_agents"],
                process_agents=options["process_agents"],
                load_seconds=options["load_seconds"],
                say=say,
            ).run()
            return verdict.passed

        try:
            if options["keep"]:
                passed = drill(options["keep"])
            else:
                with scratch() as workdir:
                    passed = drill(workdir)
        except ClusterError as exc:
            raise CommandError(str(exc)) from None
        if not passed:
            raise SystemExit(1)
