"""Run the crash drill (see ledgerdash.ledger.drill.runner) and store its report.

    python manage.py crashdrill                       # every case, idempotent and not, in process and over HTTP
    python manage.py crashdrill --iterations 200 --seed 7
    python manage.py crashdrill --json-out drill.json
    python manage.py crashdrill --provider stripe     # against Stripe's replica, through the Stripe preset

Exit code 0 only if every assertion of every case held; 1 otherwise.
"""

from __future__ import annotations

import json
import logging
import secrets
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledgerdash.ledger.drill.providers import PROVIDERS
from ledgerdash.ledger.drill.runner import Drill, fixed_plan, random_plan
from ledgerdash.ledger.models import DrillRun
from ledgerdash.ops.progress import Progress


class Command(BaseCommand):
    help = (
        "Kill real agents and reconcilers where a crash can duplicate or lose a tool call, recover, and prove "
        "nothing happened twice and nothing was lost."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--iterations", type=int, default=None, help="random mode: this many random cases")
        parser.add_argument("--seed", type=int, default=None, help="random mode: the seed (printed; reruns exactly)")
        parser.add_argument("--json-out", type=Path, default=None, help="also write the report here")
        parser.add_argument("--tenant", default="crashdrill", help="the drill's tenant (created if missing)")
        parser.add_argument("--sandbox-url", default=None, help="use a running sandbox instead of starting one")
        parser.add_argument("--workdir", type=Path, default=None, help="where the drill's sandbox keeps its store")
        parser.add_argument(
            "--provider",
            choices=sorted(PROVIDERS),
            default=None,
            help="run against this provider's replica, the drill's tools set to its preset (docs/providers.md)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["verbosity"] < 2:
            # The report says what recovery decided; its log lines are for -v 2.
            logging.getLogger("ledgerdash.reconciler").setLevel(logging.WARNING)
        iterations, seed = options["iterations"], options["seed"]
        if iterations is not None and iterations < 1:
            raise CommandError("--iterations must be at least 1")
        if iterations is None and seed is not None:
            raise CommandError("--seed goes with --iterations (the fixed drill has no randomness)")
        name = options["provider"]
        if name is not None and options["sandbox_url"]:
            raise CommandError("--provider runs against the provider's replica: leave out --sandbox-url")
        deduplicates = PROVIDERS[name].adapter.deduplicates if name is not None else None
        if iterations is not None:
            seed = seed if seed is not None else secrets.randbelow(2**31)
            plan, mode = random_plan(iterations, seed, deduplicates=deduplicates), "random"
            self.stdout.write(
                f"crash drill: {iterations} random cases, seed {seed} (rerun: --iterations {iterations} --seed {seed})"
            )
        elif name is not None:
            plan, mode = fixed_plan(deduplicates=deduplicates), "fixed"
            provider = PROVIDERS[name]
            kind = "idempotent tools (it deduplicates by key)" if deduplicates else "a non-idempotent tool"
            self.stdout.write(
                f"crash drill against the {name} replica through the {provider.preset} preset: {len(plan)} cases "
                f"(A to L for {kind}, in process, over the HTTP API and through the MCP gateway)"
            )
        else:
            plan, mode = fixed_plan(), "fixed"
            self.stdout.write(
                f"crash drill: {len(plan)} cases (A to L, each for an idempotent and a non-idempotent tool; "
                "A to D in process and over the HTTP API; A to C also for a tool that claims its dispatch "
                "with the intent)"
            )
        with (
            Progress("crash drill", total=len(plan), write=self.stdout.write) as bar,
            Drill(
                tenant=options["tenant"],
                workdir=options["workdir"],
                sandbox_url=options["sandbox_url"],
                provider=name,
                progress=bar.done,
            ) as drill,
        ):
            run = drill.run(plan, mode=mode, seed=seed)
        self._summarize(run)
        self.stdout.write(run.report["keys"]["note"])
        if options["json_out"]:
            options["json_out"].write_text(json.dumps(run.report, indent=2, default=str))
            self.stdout.write(f"report written to {options['json_out']}")
        if not run.ok:
            raise SystemExit(1)

    def _summarize(self, run: DrillRun) -> None:
        cases = run.report["cases"]
        self.stdout.write("")
        for case in cases:
            self.stdout.write(f"{case['id']}: {case['title']} ({case['tool']})")
            self.stdout.write(f"    at the provider: {case['at_provider']}")
            self.stdout.write(f"    in the ledger:   {case['in_ledger']}")
            for check in case["assertions"]:
                if not check["held"]:
                    self.stdout.write(self.style.ERROR(f"    FAILED {check['name']}: {check['evidence']}"))
        passed = run.cases_total - run.cases_failed
        line = f"drill #{run.pk} on {run.database}: {passed} of {run.cases_total} cases held every assertion"
        if run.seed is not None:
            line += f" (seed {run.seed})"
        self.stdout.write(self.style.SUCCESS(line) if run.ok else self.style.ERROR(line))
