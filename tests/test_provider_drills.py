"""``manage.py crashdrill --provider NAME`` against each provider's replica,
through its preset: every case the provider's kind of tool runs, every
assertion held."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ledgerdash.ledger.drill.cases import fixed_plan
from ledgerdash.ledger.drill.providers import PROVIDERS
from ledgerdash.replicas import replica
from tests.live import manage

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("DATABASE_URL", "").startswith("postgres"), reason="the SQLite run"),
]

#: Each drill starts a replica, agents and reconcilers of its own: they run in two lines of three,
#: one after another on each of two workers (begun first: minutes each line), beside the rest.
DRILLS = [
    pytest.param(name, marks=[pytest.mark.xdist_group(f"provider-drill-{n % 2}"), pytest.mark.longest])
    for n, name in enumerate(sorted(PROVIDERS))
]


def test_a_provider_drill_plans_only_the_kinds_the_provider_can_be() -> None:
    stripe = fixed_plan(deduplicates=True)
    slack = fixed_plan(deduplicates=False)
    assert {p.idempotent for p in stripe} == {True}
    assert any(p.claimed for p in stripe)
    assert {p.idempotent for p in slack} == {False}
    assert {p.letter for p in slack} == {p.letter for p in stripe} == set("ABCDEFGHIJKL")
    assert {p.via for p in slack} == {"process", "http", "mcp"}


@pytest.mark.parametrize("name", sorted(PROVIDERS))
def test_the_drill_switches_on_every_unkind_behaviour_its_replica_has(name: str) -> None:
    """An account set up the unkind way, in every way the provider's replica can show: a preset that
    holds only against a kind replica is not drilled."""
    drilled = PROVIDERS[name]
    assert set(drilled.modes) | set(drilled.left_off) == set(replica(name).MODES)
    assert not set(drilled.modes) & set(drilled.left_off)
    assert all(len(why) > 40 for why in drilled.left_off.values()), "a mode left off says why"
    for mode, value in PROVIDERS[name].modes.items():
        assert value != replica(name).MODES[mode].off, f"{name}: the drill leaves {mode} off"


@pytest.mark.timeout(900)
@pytest.mark.parametrize("provider", DRILLS)
def test_the_drill_passes_against_the_providers_replica(provider: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update({"DEBUG": "true", "LEDGERDASH_VAR_DIR": str(tmp_path), "DATABASE_URL": ""})
    result = manage(env, "crashdrill", "--provider", provider, "--json-out", str(tmp_path / "drill.json"))
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "drill.json").read_text())
    cases = len(fixed_plan(deduplicates=PROVIDERS[provider].adapter.deduplicates))
    assert f"{cases} of {cases} cases held every assertion" in result.stdout
    assert report["ok"] is True
    assert report["provider"]["preset"] == PROVIDERS[provider].preset
    tools = {case["tool"] for case in report["cases"]}
    assert tools <= {"drill.send_email", "drill.send_email_claimed", "drill.charge_card"}
    for case in report["cases"]:
        assert all(check["held"] for check in case["assertions"]), case
        # Every side effect was counted at the replica, under this run's keys.
        assert "performed" in case["at_provider"] or case["at_provider"] == "no request reached the provider"
    # Settled by the preset's lookup: its payload hash compared, or (where the provider changed what it
    # shows, Twilio's redaction) by the provider's id the dispatcher recorded.
    looked_up = [c for c in report["cases"] if "provider has" in c["in_ledger"]]
    assert looked_up, "no case was settled by the preset's lookup"
