"""Stored crash-drill reports in the dashboard: readable by the tenant's
members, invisible to everyone else, and naming what failed."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from ledgerdash.ledger.models import DrillRun, Tenant
from tests.conftest import as_user, record


def stored_run(tenant: Tenant, *, ok: bool, **case_fields: Any) -> DrillRun:
    """A run as the drill stores it (the drill itself is tested in test_crashdrill)."""
    attempt = record(tenant, "drill:1:001-B-non-idempotent", args={"amount": 1})
    case = {
        "id": "001-B-non-idempotent",
        "case": "B",
        "title": "kill after the request left, before its response was read",
        "tool": "charge_card",
        "idempotent": False,
        "crash_point": "after_send",
        "key": attempt.idempotency_key,
        "ok": ok,
        "at_provider": "drill:1:001-B-non-idempotent performed 2 times" if not ok else "performed 1 time",
        "in_ledger": f"#{attempt.pk} INTENT_RECORDED",
        "steps": [{"step": "worker runs the task, killed at after_send", "crashed_at": "after_send", "killed_pid": 7}],
        "assertions": [
            {
                "name": "no_duplicate_effect",
                "held": ok,
                "evidence": "duplicate effect: key drill:1:001-B-non-idempotent was performed 2 times at the provider"
                if not ok
                else "sandbox effect counts: 1",
            }
        ],
        "attempts": [
            {
                "id": attempt.pk,
                "state": attempt.state,
                "args_hash": attempt.args_hash,
                "provider_request_id": "",
                "credential_scope": attempt.credential_scope,
                "parent_id": None,
            }
        ],
        "events": [],
        **case_fields,
    }
    return DrillRun.objects.create(
        tenant=tenant,
        database="sqlite",
        ok=ok,
        cases_total=1,
        cases_failed=0 if ok else 1,
        seed=42,
        iterations=1,
        mode="random",
        report={"cases": [case]},
    )


def test_members_see_their_tenants_drill_runs(tenant_a: Tenant, tenant_b: Tenant, viewer_a: Any) -> None:
    mine = stored_run(tenant_a, ok=True)
    theirs = stored_run(tenant_b, ok=False)
    page = as_user(viewer_a).get(reverse("reviews:drills")).content.decode()
    assert f'href="{reverse("reviews:drill", args=[mine.pk])}"' in page
    assert f'href="{reverse("reviews:drill", args=[theirs.pk])}"' not in page
    home = as_user(viewer_a).get(reverse("reviews:home")).content.decode()
    assert "Latest crash drills" in home


def test_a_failed_run_names_the_duplicate(tenant_a: Tenant, viewer_a: Any) -> None:
    run = stored_run(tenant_a, ok=False)
    response = as_user(viewer_a).get(reverse("reviews:drill", args=[run.pk]))
    page = response.content.decode()
    assert response.status_code == 200
    assert "What failed" in page
    assert "duplicate effect: key drill:1:001-B-non-idempotent was performed 2 times at the provider" in page
    assert "crashdrill --iterations 1 --seed 42" in page
    attempt_id = run.report["cases"][0]["attempts"][0]["id"]
    assert f'href="{reverse("reviews:attempt", args=[attempt_id])}"' in page


@pytest.mark.parametrize(
    ("fields", "kind"),
    [
        ({}, "not idempotent"),  # a report stored before cases said "claimed"
        ({"idempotent": True, "claimed": False}, "idempotent"),
        ({"idempotent": True, "claimed": True}, "idempotent, its dispatch claimed with the intent"),
    ],
)
def test_a_case_says_how_its_tool_records(fields: dict[str, bool], kind: str, tenant_a: Tenant, viewer_a: Any) -> None:
    run = stored_run(tenant_a, ok=True, **fields)
    page = as_user(viewer_a).get(reverse("reviews:drill", args=[run.pk])).content.decode()
    assert f"</code> ({kind})</dd>" in page
    report = as_user(viewer_a).get(reverse("reviews:drill_report", args=[run.pk])).content.decode()
    assert report.count(f"</bdi> ({kind})") == 2  # the summary table and the case's own section


def test_another_tenants_run_is_a_404(tenant_a: Tenant, tenant_b: Tenant, outsider_b: Any) -> None:
    run = stored_run(tenant_a, ok=True)
    assert as_user(outsider_b).get(reverse("reviews:drill", args=[run.pk])).status_code == 404


@pytest.mark.parametrize("name", ["drills", "drill"])
def test_drill_pages_are_read_only(name: str, tenant_a: Tenant, viewer_a: Any) -> None:
    run = stored_run(tenant_a, ok=True)
    args = [run.pk] if name == "drill" else []
    assert as_user(viewer_a).post(reverse(f"reviews:{name}", args=args)).status_code == 405


def test_drill_pages_need_a_log_in(tenant_a: Tenant) -> None:
    response = Client().get(reverse("reviews:drills"))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


def test_a_run_links_its_printable_report(tenant_a: Tenant, viewer_a: Any) -> None:
    run = stored_run(tenant_a, ok=True)
    page = as_user(viewer_a).get(reverse("reviews:drill", args=[run.pk])).content.decode()
    assert f'href="{reverse("reviews:drill_report", args=[run.pk])}"' in page
