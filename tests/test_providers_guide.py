"""docs/providers.md as a user follows it: its example file applied with
``ledger_config`` on a fresh database gives the tools the page says, each
with its provider's facts, and a preset tool that contradicts them is
refused with the page's reason."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from ledgerdash.ledger.models import Tool
from ledgerdash.ledger.providers import factory
from ledgerdash.ledger.providers.presets import PRESETS
from tests.live import ROOT

GUIDE = ROOT / "docs" / "providers.md"


def example() -> str:
    (first, *_) = re.findall(r"^```toml\n(.*?)^```$", GUIDE.read_text(), re.MULTILINE | re.DOTALL)
    return first


@pytest.mark.django_db
def test_the_example_gives_the_tools_the_page_describes(tmp_path: Path) -> None:
    path = tmp_path / "providers.toml"
    path.write_text(example())
    call_command("ledger_config", "apply", str(path), stdout=io.StringIO(), stderr=io.StringIO())

    charge = Tool.objects.get(name="charge_customer")
    update = Tool.objects.get(name="post_update")
    assert charge.adapter == update.adapter == Tool.Adapter.PRESET
    assert charge.idempotent is True
    assert charge.key_retention_seconds == 86400
    assert factory.lookup_lag(charge) == PRESETS["stripe.payment_intent"].documented_lag_seconds
    assert update.idempotent is False
    assert update.lookup_lag_seconds == 30.0
    assert "86,400 s" in GUIDE.read_text()


@pytest.mark.django_db
def test_a_tool_that_contradicts_its_preset_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "providers.toml"
    path.write_text(
        example().replace(
            'adapter = "preset"\nlookup_lag_seconds', 'adapter = "preset"\nidempotent = true\nlookup_lag_seconds'
        )
    )
    with pytest.raises(CommandError, match="does not deduplicate: idempotent must be false"):
        call_command("ledger_config", "apply", str(path), stdout=io.StringIO(), stderr=io.StringIO())
    assert not Tool.objects.exists()


def test_every_preset_has_its_section_and_its_row() -> None:
    text = GUIDE.read_text()
    for name in PRESETS:
        assert f"| `{name}` |" in text, name
        assert f"`{name}`" in text.split("## Each preset", 1)[1], name


def test_every_blind_spot_and_every_unkind_behaviour_is_in_the_guide_with_its_source() -> None:
    """What a preset cannot see and what a replica shows are stated as data; the page says each, and
    where the provider documents it."""
    from ledgerdash.replicas import REPLICAS, replica

    text = GUIDE.read_text()
    for name, cls in PRESETS.items():
        for spot in cls.blind_spots:
            assert f"`{spot.name}`" in text, f"{name}: blind spot {spot.name} is not in the guide"
            address = spot.source.rsplit(" ", 1)[-1]
            assert address in text, f"{name}: {spot.name}'s source {address} is not cited"
    for provider in REPLICAS:
        for mode, about in replica(provider).MODES.items():
            assert f"`{mode}`" in text, f"{provider}: mode {mode} is not in the guide"
            address = about.source.rsplit(" ", 1)[-1]
            assert address in text, f"{provider}: {mode}'s source {address} is not cited"
