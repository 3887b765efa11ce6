"""Audit exports: the queues' filters, a stable column set, formula-safe
CSV, an audit event per export, and files an auditor verifies offline."""

from __future__ import annotations

import csv
import io
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.urls import reverse

from ledgerdash.ledger import moves
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Attempt, AttemptEvent, ChainHead, State, Tenant
from reviews import exports
from tests import tamper
from tests.conftest import AGENT, as_user, ledger_snapshot, record
from tests.live import PYTHON, ROOT

S = State
VERIFY = str(ROOT / "scripts" / "verify_export.py")


def export_cli(tmp_path: Path, *args: str, fmt: str = "csv") -> Path:
    out = tmp_path / f"export.{fmt}"
    call_command("export_audit", "--format", fmt, "--out", str(out), *args)
    return out


def rows_of(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".ndjson":
        return [json.loads(line) for line in text.splitlines()]
    return list(csv.DictReader(io.StringIO(text)))


def verify_file(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, VERIFY, str(path), *args], capture_output=True, text=True, timeout=60, check=False)


# --- shape -----------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["csv", "ndjson"])
def test_a_full_export_is_every_event_up_to_the_head_and_verifies_offline(
    stuck: dict[str, Attempt], tenant_a: Tenant, tmp_path: Path, fmt: str
) -> None:
    head = ChainHead.objects.get(tenant=tenant_a)
    path = export_cli(tmp_path, "--tenant", "acme", fmt=fmt)
    rows = rows_of(path)
    assert rows[0]["record"] == "export"
    events = [r for r in rows if r["record"] == "event"]
    assert [int(r["event_seq"]) for r in events] == list(range(1, head.seq + 1))
    assert {r["tenant"] for r in events} == {"acme"}
    assert rows[-1]["record"] == "head"
    assert (int(rows[-1]["event_seq"]), rows[-1]["hash"]) == (head.seq, head.hash)
    result = verify_file(path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"acme: VERIFIED seq 1..{head.seq}, complete and unmodified up to head {head.hash}" in result.stdout


def test_the_csv_columns_are_the_documented_ones(stuck: dict[str, Attempt], tmp_path: Path) -> None:
    path = export_cli(tmp_path, "--tenant", "acme")
    header = path.read_text(encoding="utf-8").splitlines()[0].split(",")
    assert tuple(header) == exports.COLUMNS
    reference = (ROOT / "docs" / "audit.md").read_text(encoding="utf-8")
    for column in exports.COLUMNS:
        assert f"`{column}`" in reference, f"docs/audit.md does not document the {column} column"


def test_each_event_row_carries_its_attempt_and_the_decision(stuck: dict[str, Attempt], tmp_path: Path) -> None:
    attempt = stuck["a_review"]
    rows = [r for r in rows_of(export_cli(tmp_path, "--tenant", "acme")) if r["attempt_id"] == str(attempt.pk)]
    assert len(rows) == AttemptEvent.objects.filter(attempt=attempt).count()
    for row in rows:
        assert row["task_id"] == attempt.task_id
        assert row["tool_name"] == "send_email"
        assert row["idempotency_key"] == "a-review"
        assert row["args_hash"] == attempt.args_hash
        assert json.loads(row["args"]) == attempt.args
        assert row["policy_version"] == "1"
        assert row["state"] == "MANUAL_REVIEW"
        assert row["owner"] == "oncall-a"
    last = rows[-1]
    assert (last["from_state"], last["to_state"]) == ("UNKNOWN", "MANUAL_REVIEW")
    assert last["actor_kind"] == "reconciler"
    assert last["actor_label"] == "reconciler-test"
    assert last["reason"] == "not idempotent"
    assert last["event_at"].endswith("+00:00")


# --- filters ----------------------------------------------------------------------------------


def _attempt_ids(rows: list[dict[str, Any]]) -> set[int]:
    return {int(r["attempt_id"]) for r in rows if r["record"] == "event"}


def test_the_command_takes_the_queues_filters(
    stuck: dict[str, Attempt], tenant_a: Tenant, operator_a: Any, tmp_path: Path
) -> None:
    def ids(*args: str) -> set[int]:
        return _attempt_ids(rows_of(export_cli(tmp_path, "--tenant", "acme", *args)))

    assert ids("--state", "UNKNOWN") == {stuck["a_unknown"].pk}
    assert ids("--tool", "charge_card") == set()
    other = record(tenant_a, "a-charge", tool_name="charge_card", args={"amount": 5})
    assert ids("--tool", "charge_card") == {other.pk}
    moves.attempt_assign(attempt=stuck["a_done"], owner=operator_a, actor=AGENT, reason="t", expected_owner_id=None)
    assert ids("--owner", "operator-a") == {stuck["a_done"].pk}
    assert ids("--owner", "unassigned") == {other.pk}
    created = stuck["a_review"].created_at.isoformat()
    assert ids("--since", created, "--until", stuck["a_done"].created_at.isoformat()) == {stuck["a_review"].pk}


def test_a_filtered_export_says_so_and_proves_what_it_can(stuck: dict[str, Attempt], tmp_path: Path) -> None:
    path = export_cli(tmp_path, "--tenant", "acme", "--state", "MANUAL_REVIEW")
    rows = rows_of(path)
    assert json.loads(rows[0]["details"])["scope"] == "filtered"
    result = verify_file(path)
    assert result.returncode == 0, result.stdout
    assert "cannot prove completeness" in result.stdout


def test_a_filtered_export_with_links_walks_to_the_head(
    stuck: dict[str, Attempt], tenant_a: Tenant, tmp_path: Path
) -> None:
    path = export_cli(tmp_path, "--tenant", "acme", "--state", "MANUAL_REVIEW", "--links")
    rows = rows_of(path)
    links = [r for r in rows if r["record"] == "link"]
    assert links
    assert all(r["reason"] == "" and r["attempt_id"] == "" for r in links)  # only seq and hashes
    assert _attempt_ids(rows) == {stuck["a_review"].pk}
    result = verify_file(path)
    assert result.returncode == 0, result.stdout
    assert "acme: VERIFIED" in result.stdout


def test_an_edited_row_is_broken_and_nothing_is_said_to_be_verified(
    stuck: dict[str, Attempt], tenant_a: Tenant, tmp_path: Path
) -> None:
    path = export_cli(tmp_path, "--tenant", "acme")
    text = path.read_text(encoding="utf-8")
    assert "intent recorded" in text
    path.write_text(text.replace("intent recorded", "intent altered", 1), encoding="utf-8")
    result = verify_file(path)
    assert result.returncode == 1
    assert "BROKEN:" in result.stdout
    assert "edited" in result.stdout
    assert "VERIFIED seq" not in result.stdout
    assert "NOT VERIFIED" in result.stdout


def test_unknown_tenants_users_and_times_are_errors(stuck: dict[str, Attempt], tmp_path: Path) -> None:
    from django.core.management import CommandError

    for args, message in [
        (["--tenant", "nobody"], "no such tenant: nobody"),
        (["--tenant", "acme", "--owner", "nobody"], "no such user: nobody"),
        (["--tenant", "acme", "--since", "2026-01-01T00:00:00"], "has no time zone"),
    ]:
        with pytest.raises(CommandError, match=message):
            call_command("export_audit", "--out", str(tmp_path / "x.csv"), *args)


# --- tamper evidence in the file ----------------------------------------------------------


def test_an_edited_export_file_fails_offline_with_the_row_named(stuck: dict[str, Attempt], tmp_path: Path) -> None:
    path = export_cli(tmp_path, "--tenant", "acme")
    rows = rows_of(path)
    victim = next(r for r in rows if r["record"] == "event" and r["reason"] == "timeout")
    text = path.read_text(encoding="utf-8").replace(",timeout,", ",network blip,", 1)
    path.write_text(text, encoding="utf-8")
    result = verify_file(path)
    assert result.returncode == 1
    assert f"acme seq {victim['event_seq']} (event id {victim['event_id']}): edited" in result.stdout


def test_a_row_dropped_from_the_file_fails_offline(stuck: dict[str, Attempt], tmp_path: Path) -> None:
    path = export_cli(tmp_path, "--tenant", "acme", fmt="ndjson")
    lines = path.read_text(encoding="utf-8").splitlines()
    del lines[3]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = verify_file(path)
    assert result.returncode == 1
    assert "missing before it" in result.stdout


def test_a_cut_short_file_fails_offline(stuck: dict[str, Attempt], tmp_path: Path) -> None:
    path = export_cli(tmp_path, "--tenant", "acme", fmt="ndjson")
    lines = path.read_text(encoding="utf-8").splitlines()
    path.write_text("\n".join(lines[:-1]) + "\n", encoding="utf-8")
    result = verify_file(path)
    assert result.returncode == 1
    assert "no head row: the file was cut short" in result.stdout


@tamper.commits
def test_an_export_of_a_tampered_ledger_fails_offline(stuck: dict[str, Attempt], tmp_path: Path) -> None:
    victim = AttemptEvent.objects.filter(attempt=stuck["a_done"]).order_by("seq").last()
    assert victim is not None
    tamper.edit(victim.pk, reason="never happened")
    result = verify_file(export_cli(tmp_path, "--tenant", "acme"))
    assert result.returncode == 1
    assert f"acme seq {victim.seq} (event id {victim.pk}): edited" in result.stdout


def test_a_kept_head_is_checked(stuck: dict[str, Attempt], tenant_a: Tenant, tmp_path: Path) -> None:
    head = ChainHead.objects.get(tenant=tenant_a)
    path = export_cli(tmp_path, "--tenant", "acme")
    assert verify_file(path, "--known-head", f"acme:{head.seq}:{head.hash}").returncode == 0
    forged = verify_file(path, "--known-head", f"acme:{head.seq}:{'f' * 64}")
    assert forged.returncode == 1
    assert "no longer passes through the head you kept" in forged.stdout


# --- formula injection ----------------------------------------------------------------------------

PAYLOADS = ['=HYPERLINK("http://evil.example","x")', "+1+1", "-2+3", "@SUM(A1)", "'=quoted"]
#: Task ids, keys and comments refuse (or strip) control characters; these
#: reach an export only inside the arguments' JSON.
CONTROL = ["\tcmd", "\r=1"]


def test_csv_cells_that_would_be_formulas_are_neutralized(tenant_a: Tenant, operator_a: Any, tmp_path: Path) -> None:
    for n, payload in enumerate(PAYLOADS):
        attempt = record(tenant_a, f"{payload}-{n}", task_id=payload, args={"to": payload, "note": CONTROL})
        moves.attempt_comment(attempt=attempt, actor=Actor.user(operator_a), text=payload)
    path = export_cli(tmp_path, "--tenant", "acme")
    with path.open(encoding="utf-8", newline="") as handle:
        cells = [cell for row in csv.reader(handle) for cell in row]
    dangerous = [cell for cell in cells if cell.startswith(("=", "+", "-", "@", "\t", "\r"))]
    assert dangerous == []
    for payload in PAYLOADS:
        assert "'" + payload in cells  # the task id and the comment, quoted
        assert payload not in cells
        assert f"'{payload}-{PAYLOADS.index(payload)}" in cells  # the idempotency key
    args_cells = [c for c in cells if c.startswith("{") and '"note"' in c]
    assert len(args_cells) == len(PAYLOADS) * 2  # one JSON cell per event row: it starts with a brace
    assert all(json.loads(c)["note"] == CONTROL for c in args_cells)
    for payload in [*PAYLOADS, *CONTROL]:
        assert exports.neutralize(payload) == "'" + payload
    assert exports.neutralize("plain text") == "plain text"
    # Neutralizing is undone exactly: the file still verifies.
    result = verify_file(path)
    assert result.returncode == 0, result.stdout


def test_ndjson_keeps_values_as_they_are(tenant_a: Tenant, tmp_path: Path) -> None:
    record(tenant_a, "k", task_id="=1+1")
    rows = rows_of(export_cli(tmp_path, "--tenant", "acme", fmt="ndjson"))
    assert {r["task_id"] for r in rows if r["attempt_id"] is not None} == {"=1+1"}


def test_a_call_held_for_approval_says_why_in_the_export(tenant_a: Tenant, tmp_path: Path) -> None:
    from ledgerdash.ledger import recording
    from ledgerdash.ledger.errors import AwaitingApproval
    from ledgerdash.ledger.policies import policy_publish
    from tests.conftest import TOOLS_V1

    policy_publish(tenant=tenant_a, tools=TOOLS_V1, approvals={"send_email": ""}, actor=Actor.system("t"))
    held = record(tenant_a, "held", args={"to": "ceo@example.com"})
    with pytest.raises(AwaitingApproval):
        recording.refuse_unless_dispatchable(held)
    free = record(tenant_a, "free", tool_name="open_ticket", args={"title": "t"})
    for fmt in ("csv", "ndjson"):
        (tmp_path / fmt).mkdir()
        rows = rows_of(export_cli(tmp_path / fmt, "--tenant", "acme", fmt=fmt))
        why = {int(r["attempt_id"]): r["approval_required"] for r in rows if r["attempt_id"] not in (None, "")}
        assert why[held.pk] == held.approval_required != ""
        assert why[free.pk] == ""


# --- the export is an audit event -------------------------------------------------------------


def test_exporting_is_recorded_in_each_exported_tenants_chain(
    stuck: dict[str, Attempt], tenant_a: Tenant, tmp_path: Path
) -> None:
    head_before = ChainHead.objects.get(tenant=tenant_a)
    export_cli(tmp_path, "--tenant", "acme", "--state", "UNKNOWN")
    event = AttemptEvent.objects.filter(tenant=tenant_a).order_by("seq").last()
    assert event is not None
    assert event.kind == "export"
    assert event.seq == head_before.seq + 1  # the next link after the head the file carries
    assert event.actor_label.startswith("manage.py export_audit")
    assert event.details["filters"] == {"tenant": "acme", "state": "UNKNOWN"}
    assert event.details["rows"] == AttemptEvent.objects.filter(attempt=stuck["a_unknown"]).count()
    assert event.details["complete"] is True
    assert (event.details["head_seq"], event.details["head_hash"]) == (head_before.seq, head_before.hash)


def test_the_export_reads_in_chunks(stuck: dict[str, Attempt], tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(exports, "CHUNK", 2)
    result = verify_file(export_cli(tmp_path, "--tenant", "acme"))
    assert result.returncode == 0, result.stdout


# --- the dashboard's export view --------------------------------------------------------------

EXPORT_CSV = reverse("reviews:export", args=["csv"])


def _download(response: Any) -> list[dict[str, Any]]:
    body = b"".join(response.streaming_content).decode()
    return list(csv.DictReader(io.StringIO(body)))


def test_operators_download_their_queue_with_its_filters(
    stuck: dict[str, Attempt], operator_a: Any, tenant_a: Tenant
) -> None:
    response = as_user(operator_a).post(EXPORT_CSV, {"queue": "unknown", "tenant": "acme", "after": "1-1"})
    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"].startswith('attachment; filename="ledgerdash-audit-acme-')
    rows = _download(response)
    assert _attempt_ids(rows) == {stuck["a_unknown"].pk}  # the whole selection, not one page
    event = AttemptEvent.objects.filter(tenant=tenant_a, kind="export").get()
    assert event.actor_user_id == operator_a.pk
    assert event.details["filters"] == {"tenant": "acme", "state": "UNKNOWN"}


def test_the_ndjson_download(stuck: dict[str, Attempt], operator_a: Any) -> None:
    response = as_user(operator_a).post(reverse("reviews:export", args=["ndjson"]))
    assert response["Content-Type"] == "application/x-ndjson; charset=utf-8"
    lines = [json.loads(line) for line in b"".join(response.streaming_content).decode().splitlines()]
    assert lines[0]["details"]["scope"] == "full"
    assert {line["tenant"] for line in lines[1:]} == {"acme"}


def test_the_export_is_a_post_with_the_csrf_token(stuck: dict[str, Attempt], operator_a: Any) -> None:
    """An export writes an audit event: a link (or a form) on another site must not start one."""
    before = ledger_snapshot()
    client = as_user(operator_a)
    assert client.get(EXPORT_CSV).status_code == 405
    assert client.head(EXPORT_CSV).status_code == 405
    client.handler.enforce_csrf_checks = True
    assert client.post(EXPORT_CSV, {"tenant": "acme"}).status_code == 403
    assert ledger_snapshot() == before
    page = client.get(reverse("reviews:search"))
    token = page.context["csrf_token"]
    response = client.post(EXPORT_CSV, {"tenant": "acme", "csrfmiddlewaretoken": str(token)})
    assert response.status_code == 200
    assert _download(response)
    assert AttemptEvent.objects.filter(kind="export").count() == 1


def test_another_tenant_in_the_filter_is_404_and_exports_nothing(stuck: dict[str, Attempt], outsider_b: Any) -> None:
    before = ledger_snapshot()
    response = as_user(outsider_b).post(EXPORT_CSV, {"tenant": "acme"})
    assert response.status_code == 404
    assert b"a-unknown" not in response.content
    assert ledger_snapshot() == before


def test_viewers_may_not_export(stuck: dict[str, Attempt], viewer_a: Any) -> None:
    before = ledger_snapshot()
    assert as_user(viewer_a).post(EXPORT_CSV).status_code == 403
    assert ledger_snapshot() == before


def test_a_bad_filter_is_refused_rather_than_widened(stuck: dict[str, Attempt], operator_a: Any) -> None:
    response = as_user(operator_a).post(EXPORT_CSV, {"owner": "everyone"})
    assert response.status_code == 400
    assert b"not exported" in response.content


def test_an_unknown_format_or_queue_is_404(operator_a: Any) -> None:
    client = as_user(operator_a)
    assert client.post(reverse("reviews:export", args=["xlsx"])).status_code == 404
    assert client.post(EXPORT_CSV, {"queue": "everything"}).status_code == 404


def test_the_list_pages_carry_their_filters_into_the_export_form(stuck: dict[str, Attempt], operator_a: Any) -> None:
    client = as_user(operator_a)
    page = client.get(reverse("reviews:queue", args=["unknown"]), {"tool": "send_email", "after": "1-1"}).content
    assert b'<form class="exports" method="post" action="/export.csv">' in page
    assert b'formaction="/export.ndjson"' in page
    assert b'<input type="hidden" name="tool" value="send_email">' in page
    assert b'<input type="hidden" name="queue" value="unknown">' in page
    assert b'name="after"' not in page.split(b'class="exports"')[1].split(b"</form>")[0]  # every page, not one


def test_viewers_get_no_export_links(stuck: dict[str, Attempt], viewer_a: Any) -> None:
    assert b"/export.csv" not in as_user(viewer_a).get(reverse("reviews:search")).content


def test_an_abandoned_download_is_recorded_as_incomplete(
    stuck: dict[str, Attempt], operator_a: Any, tenant_a: Tenant, monkeypatch: Any
) -> None:
    monkeypatch.setattr(exports, "FLUSH_BYTES", 1)
    chunks = exports.stream(exports.ExportRequest(tenants=[tenant_a], format="csv", actor=Actor.user(operator_a)))
    next(chunks)
    chunks.close()  # the reader went away: the server closes the response, and so the stream
    event = AttemptEvent.objects.filter(tenant=tenant_a, kind="export").get()
    assert event.details["complete"] is False
    assert event.reason.startswith("export interrupted after")


def test_exporting_every_tenant_needs_the_operator_role_in_each(
    stuck: dict[str, Attempt], operator_a: Any, tenant_b: Tenant
) -> None:
    from ledgerdash.ledger.models import Membership

    Membership.objects.create(user=operator_a, tenant=tenant_b, role="viewer")
    client = as_user(operator_a)
    refused = client.post(EXPORT_CSV)
    assert refused.status_code == 403
    assert AttemptEvent.objects.filter(kind="export").count() == 0
    assert client.post(EXPORT_CSV, {"tenant": "acme"}).status_code == 200


@pytest.mark.postgres
def test_the_server_formatted_export_is_the_same_file(
    stuck: dict[str, Attempt], tenant_a: Tenant, operator_a: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    """A full CSV export on PostgreSQL is formatted by the server; cell for
    cell it must be what the Python path writes, formula payloads included."""
    for n, payload in enumerate(PAYLOADS):
        attempt = record(tenant_a, f"{payload}-{n}", task_id=payload, args={"to": payload, "note": CONTROL})
        moves.attempt_comment(attempt=attempt, actor=Actor.user(operator_a), text=payload)
    head = ChainHead.objects.get(tenant=tenant_a).seq
    (tmp_path / "fast").mkdir()
    (tmp_path / "slow").mkdir()
    fast = export_cli(tmp_path / "fast", "--tenant", "acme")
    monkeypatch.setattr(exports, "_server_formats", lambda request: False)
    slow = export_cli(tmp_path / "slow", "--tenant", "acme")

    def events(path: Path) -> list[list[str]]:
        with path.open(encoding="utf-8", newline="") as handle:
            rows = list(csv.reader(handle))
        seq = rows[0].index("event_seq")
        return [row for row in rows[1:] if row[0] == "event" and int(row[seq]) <= head]

    assert len(events(fast)) == head
    assert events(fast) == events(slow)
    assert verify_file(fast).returncode == 0
