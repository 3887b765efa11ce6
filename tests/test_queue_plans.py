"""The dashboard's list reads stay index range scans on a large ledger.

PostgreSQL only: the attempts are bulk-inserted with one INSERT … SELECT
(``LEDGERDASH_PLAN_ROWS``, default 200,000; the figures in docs/benchmarks.md are from
1,000,000), then every query a list page runs is EXPLAINed (ANALYZE):
no sequential scan, no sort over the tenant's rows, a page read in
milliseconds. This is a read benchmark: the rows are written directly,
not through the transitions.

``LEDGERDASH_PLAN_REPORT=path`` writes the plans there as text.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ledgerdash.ledger import tenancy
from ledgerdash.ledger.models import Membership, State, Tenant
from reviews import queries
from reviews.queries import Cursor, ListQuery
from tests.database_roles import admin_connect

# Transactional, so the filled table can be vacuumed (not inside a transaction).
pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ROWS = int(os.environ.get("LEDGERDASH_PLAN_ROWS", "200000"))

FILL = """
INSERT INTO ledger_attempt (
    tenant_id, task_id, tool_name, idempotency_key, provider_key, args, args_hash, state,
    policy_version, credential_scope, owner_id, fence, dispatch_count, check_count,
    provider_request_id, result_ref, last_error, last_lookup, last_note, created_at, updated_at
)
SELECT
    tenants[1 + i %% array_length(tenants, 1)],
    'task-' || (i / 10),
    (ARRAY['send_email', 'charge_card', 'open_ticket', 'deploy_service'])[1 + (i / 7) %% 4],
    'key-' || i,
    'key-' || i,
    '{}'::jsonb,
    md5(i::text) || md5((i + 1)::text),
    CASE WHEN i %% 100 < 4 THEN 'UNKNOWN' WHEN i %% 100 < 7 THEN 'MANUAL_REVIEW'
         WHEN i %% 100 < 9 THEN 'FAILED' ELSE 'OUTCOME_CONFIRMED' END,
    1, 'email:send',
    -- Stuck work has an owner (but 1 in 50 has none); so does some settled work.
    CASE WHEN i %% 100 < 7 AND (i / 100) %% 50 = 0 THEN NULL
         WHEN i %% 100 < 20 THEN owners[1 + (i / 100) %% array_length(owners, 1)] END,
    3, 1, 0,
    CASE WHEN i %% 100 >= 9 THEN 'req-' || i ELSE '' END,
    '', '', '', 'bulk-loaded',
    now() - (%(rows)s - i) * interval '7 seconds',
    now()
FROM generate_series(1, %(rows)s) AS i,
     (SELECT %(tenants)s::bigint[] AS tenants, %(owners)s::integer[] AS owners) AS p
"""


@pytest.fixture
def big_ledger(tenant_a: Tenant, tenant_b: Tenant, operator_a: Any, approver_a: Any, make_user: Any) -> Any:
    """ROWS attempts over five tenants; operator_a is a member of two of them."""
    others = [Tenant.objects.create(slug=f"t{n}", name=f"T{n}") for n in range(3)]
    tenants = [tenant_a, tenant_b, *others]
    Membership.objects.create(user=operator_a, tenant=tenant_b, role="operator")
    owners = [operator_a.pk, approver_a.pk, make_user("someone").pk]
    with connection.cursor() as cursor:
        cursor.execute(FILL, {"rows": ROWS, "tenants": [t.pk for t in tenants], "owners": owners})
    # As autovacuum leaves a table in service: statistics and a visibility
    # map (so the planner may count and page from the index alone). Only the
    # table's owner may vacuum it, not the app's runtime role.
    with admin_connect() as admin:
        admin.execute("VACUUM ANALYZE ledger_attempt")
    return operator_a


def _plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _plan_nodes(child)


def _explain(sql: str) -> dict[str, Any]:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql)
        row = cursor.fetchone()
    assert row is not None
    document = row[0] if isinstance(row[0], list) else json.loads(row[0])
    return dict(document[0])


def _text_plan(sql: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, COSTS OFF, TIMING ON) " + sql)
        return "\n".join(line for (line,) in cursor.fetchall())


def _page_queries(user: Any, query: ListQuery) -> list[str]:
    """The SQL of the keyset read (per tenant, in one statement) one list page runs."""
    with CaptureQueriesContext(connection) as captured:
        queries.list_page(user, query)
    return [q["sql"] for q in captured.captured_queries if "ORDER BY" in q["sql"] and "LIMIT" in q["sql"]]


def _report(title: str, sql: str) -> None:
    path = os.environ.get("LEDGERDASH_PLAN_REPORT")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(f"## {title}\n\n{sql}\n\n{_text_plan(sql)}\n\n")


#: A page reads at most this many index entries (the page, the rows its
#: filters pass over, and the cursor's own timestamp).
MAX_ROWS_READ = 25 * (queries.PAGE_SIZE + 1)


def _check(title: str, sql: str) -> list[str]:
    """What is wrong with the plan of ``sql`` (nothing, for a good one)."""
    _report(title, sql)
    explained = _explain(sql)
    problems = []
    attempt_nodes = [node for node in _plan_nodes(explained["Plan"]) if node.get("Relation Name") == "ledger_attempt"]
    kinds = [node["Node Type"] for node in _plan_nodes(explained["Plan"])]
    if any(node["Node Type"] == "Seq Scan" for node in attempt_nodes):
        problems.append(f"{title}: sequential scan of ledger_attempt ({kinds})")
    read = sum(
        (node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)) * node.get("Actual Loops", 1)
        for node in _plan_nodes(explained["Plan"])
        if node["Node Type"] in ("Index Scan", "Index Only Scan", "Bitmap Index Scan")
    )
    if read > MAX_ROWS_READ:
        problems.append(f"{title}: read {read} index entries for one page ({kinds})")
    # Not its time: a plan that reads a page's worth of index entries is the
    # one wanted however long the machine takes (a cold first read here once
    # took 0.7 s); the time is in the report, the verdict is the plan's shape.
    return problems


LISTS = [
    ("UNKNOWN queue, oldest first", {"state": State.UNKNOWN}),
    ("MANUAL_REVIEW queue, newest first", {"state": State.MANUAL_REVIEW, "oldest_first": False}),
    ("UNKNOWN queue, mine", {"state": State.UNKNOWN, "owner": "me"}),
    ("UNKNOWN queue, unassigned", {"state": State.UNKNOWN, "owner": "unassigned"}),
    (
        "UNKNOWN queue, one tool, older than a day",
        {"state": State.UNKNOWN, "tool": "send_email", "older_than": timedelta(days=1)},
    ),
    ("all attempts, newest first", {"oldest_first": False}),
    ("all attempts, FAILED", {"state": State.FAILED, "oldest_first": False}),
    ("all attempts, mine", {"owner": "me", "oldest_first": False}),
    ("awaiting approval, oldest first", {"state": State.MANUAL_REVIEW, "awaiting_approval": True}),
    ("my work, oldest first", {"states": (State.MANUAL_REVIEW, State.UNKNOWN), "owner": "me"}),
    ("waiting on people or facts, past the SLA", {"states": (State.MANUAL_REVIEW, State.UNKNOWN), "past_sla": True}),
]


def test_every_list_read_is_an_index_scan_of_a_page_not_of_the_tenant(big_ledger: Any) -> None:
    # One test, because filling the ledger is most of its time.
    user = big_ledger
    tenant_ids = tuple(tenancy.tenant_ids_for(user))
    problems: list[str] = []
    for title, fields in LISTS:
        first = ListQuery(tenant_ids=tenant_ids, **fields)
        sqls = _page_queries(user, first)
        assert len(sqls) == 1, title  # one statement: a LATERAL keyset read per tenant
        assert "LATERAL" in sqls[0], title
        for sql in sqls:
            problems += _check(title, sql)
        # Far into the list (the next page, and one 90% of the way through
        # the tenant's history) a page costs what the first one does.
        page = queries.list_page(user, first)
        cursors = [page.next_cursor] if page.next_cursor else []
        far = timezone.now() - timedelta(seconds=7 * ROWS * (0.9 if first.oldest_first else 0.1))
        cursors.append(Cursor(far, 1))
        for cursor in cursors:
            for sql in _page_queries(user, ListQuery(tenant_ids=tenant_ids, after=cursor, **fields)):
                problems += _check(f"{title}, after {cursor}", sql)
    # Search: exact matches and a hash prefix, through their own indexes.
    for needle in ["key-1234", "task-77", "req-4321", "c4ca4238a0b9", "#1234"]:
        for sql in _page_queries(user, ListQuery(tenant_ids=tenant_ids, search=needle, oldest_first=False)):
            problems += _check(f"search {needle}", sql)
    with CaptureQueriesContext(connection) as captured:
        queries.queue_counts(user, tenant_ids=tenant_ids)
    assert len(captured.captured_queries) == 1  # every count a subquery of one statement
    # UNKNOWN, MANUAL_REVIEW, awaiting approval, my work (two) and open incidents
    reads = queries.count_queries(user, list(tenant_ids))
    assert len(reads) == 6
    for name, read in reads.items():
        problems += _check(f"queue count {name}", connection.ops.compose_sql(*read.query.sql_with_params()))
    assert not problems, "\n".join(problems)
