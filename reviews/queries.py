"""Reads the dashboard's views and exports share, always scoped to the user's tenants."""

from __future__ import annotations

import heapq
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.exceptions import EmptyResultSet
from django.db import connection
from django.db.models import Q, QuerySet
from django.db.models.expressions import RawSQL
from django.utils import timezone

from ledgerdash.ledger import chain, rules
from ledgerdash.ledger.models import (
    Attempt,
    AttemptEvent,
    ChainCheck,
    DrillRun,
    Incident,
    Policy,
    State,
    Tenant,
)
from ledgerdash.ledger.queries import chain_heads, events_of_attempts
from ledgerdash.ledger.tenancy import Person, tenant_ids_for, tenants_for

#: The queues people work, by the slug in their URL.
QUEUES: dict[str, State] = {"unknown": State.UNKNOWN, "review": State.MANUAL_REVIEW}

PAGE_SIZE = 50


#: Queue counts stop here: "999+" says enough, and counting a queue of tens
#: of thousands on every refresh of every operator's page would not be cheap.
COUNT_CAP = 999


def count_queries(user: Person, tenant_ids: list[int]) -> dict[str, QuerySet[Any]]:
    """The reads behind :func:`queue_counts`, each capped at ``COUNT_CAP + 1`` rows.

    The tenant ids as constants and a LIMIT: each reads at most
    COUNT_CAP + 1 entries of an index range. The user's own work is read a
    state at a time, like the queues."""
    attempts = Attempt.objects.filter(tenant_id__in=tenant_ids).order_by()
    owner_id = getattr(user, "pk", None)
    reads: dict[str, QuerySet[Any]] = {
        State.UNKNOWN.value: attempts.filter(state=State.UNKNOWN),
        State.MANUAL_REVIEW.value: attempts.filter(state=State.MANUAL_REVIEW),
        "APPROVALS": attempts.filter(rules.awaiting_approval_filter()),
        "MINE UNKNOWN": attempts.filter(owner_id=owner_id, state=State.UNKNOWN),
        "MINE MANUAL_REVIEW": attempts.filter(owner_id=owner_id, state=State.MANUAL_REVIEW),
        "INCIDENTS": Incident.objects.filter(tenant_id__in=tenant_ids, status=Incident.Status.OPEN).order_by(),
    }
    return {name: qs.values("id")[: COUNT_CAP + 1] for name, qs in reads.items()}


def queue_counts(user: Person, *, tenant_ids: Iterable[int] | None = None) -> dict[str, int]:
    """How much is waiting in each queue, up to ``COUNT_CAP + 1`` (shown as "999+"),
    how many items await an approver (``APPROVALS``), how much UNKNOWN and
    MANUAL_REVIEW work the user owns (``MINE``) and how many incidents are
    open (``INCIDENTS``).
    ``tenant_ids``: the user's tenants, when the caller has read them already.

    The counts are subqueries of one statement: sent one query each, the
    six cost three times what the server spends on them (a round trip and
    the ORM's count() around each), on every page that shows the tabs."""
    reads = count_queries(user, list(tenant_ids) if tenant_ids is not None else tenant_ids_for(user))
    selects: list[str] = []
    params: list[Any] = []
    for qs in reads.values():
        try:
            sql, qs_params = qs.query.sql_with_params()
        except EmptyResultSet:  # no tenants: nothing to count
            selects.append("0")
            continue
        selects.append(f"(SELECT count(*) FROM ({sql}) capped)")  # noqa: S608 (compiled by the ORM)
        params.extend(qs_params)
    with connection.cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(selects), params)  # every value is a parameter
        counts = dict(zip(reads, cursor.fetchone(), strict=True))
    counts["MINE"] = min(COUNT_CAP + 1, counts.pop("MINE UNKNOWN") + counts.pop("MINE MANUAL_REVIEW"))
    return counts


def incidents_for(user: Person) -> QuerySet[Incident]:
    """The incidents of the user's tenants: open first, newest first."""
    return (
        Incident.objects.filter(tenant__in=tenants_for(user))
        .select_related("tenant", "attempt", "retry", "owner", "resolved_by")
        .order_by("status", "-opened_at", "-id")  # "open" sorts before "resolved"
    )


def not_sent_retries(tenant_ids: Iterable[int], *, limit: int = 20) -> list[Incident]:
    """The newest open ``not_sent`` incidents of these tenants: approved calls
    the ledger did not send because their side effect had happened
    meanwhile, each with its retry and the people who decided it."""
    return list(
        Incident.objects.filter(
            tenant_id__in=list(tenant_ids), kind=Incident.Kind.NOT_SENT, status=Incident.Status.OPEN
        )
        .select_related("tenant", "retry", "retry__requested_by", "retry__approved_by")
        .order_by("-opened_at", "-id")[:limit]
    )


def known_tools(tenant_ids: Iterable[int]) -> list[str]:
    """Tool names any policy version of these tenants ever allowed (filter suggestions)."""
    names: set[str] = set()
    for tools in Policy.objects.filter(tenant_id__in=list(tenant_ids)).values_list("tools", flat=True):
        names.update(tools)
    return sorted(names)


# --- lists: filters and keyset pages ----------------------------------------


@dataclass(frozen=True)
class Cursor:
    """A position in a list: the (created_at, id) of a row, as put in a URL."""

    created_at: datetime
    id: int

    _FORMAT = re.compile(r"^(\d{1,19})-(\d{1,19})$")
    _EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

    def __str__(self) -> str:
        micros = (self.created_at - self._EPOCH) // timedelta(microseconds=1)
        return f"{micros}-{self.id}"

    @classmethod
    def parse(cls, text: str) -> Cursor | None:
        match = cls._FORMAT.match(text)
        if match is None:
            return None
        try:
            created_at = cls._EPOCH + timedelta(microseconds=int(match.group(1)))
        except OverflowError:
            return None
        return cls(created_at, int(match.group(2)))

    @classmethod
    def of(cls, attempt: Attempt) -> Cursor:
        return cls(attempt.created_at, attempt.pk)


@dataclass(frozen=True)
class ListQuery:
    """What a list shows, already validated (see reviews.forms.ListForm)."""

    tenant_ids: tuple[int, ...]
    state: str = ""
    tool: str = ""
    owner: str = "anyone"  # "me", "unassigned" or "anyone"
    older_than: timedelta | None = None
    newer_than: timedelta | None = None
    search: str = ""
    oldest_first: bool = True
    after: Cursor | None = None
    before: Cursor | None = None
    page_size: int = PAGE_SIZE
    #: Absolute bounds on ``created_at`` (the export command's time range).
    since: datetime | None = None
    until: datetime | None = None
    #: Only what awaits an approver's decision (the approvals queue).
    awaiting_approval: bool = False
    #: Any of these states (``state`` is one); e.g. all work that waits on people.
    states: tuple[str, ...] = ()
    #: Only work older than its tenant's SLA.
    past_sla: bool = False
    #: Leave out what this user asked for (what awaits *their* approval).
    not_requested_by: int | None = None


@dataclass
class Page:
    rows: list[Attempt]
    #: Cursors for the neighbouring pages in display order, None at either end.
    next_cursor: Cursor | None = None
    prev_cursor: Cursor | None = None
    tenant_ids: tuple[int, ...] = field(default_factory=tuple)


_ID_SEARCH = re.compile(r"^#?(\d{1,18})$")
_HASH_PREFIX = re.compile(r"^[0-9a-f]{8,64}$")


def _search_filter(text: str) -> Q:
    """Exact matches on what an operator has in hand: an attempt number, an
    idempotency key, a task id, a provider request id, or an args hash (a
    prefix of at least 8 hex digits)."""
    q = Q(idempotency_key=text) | Q(task_id=text) | Q(provider_request_id=text)
    if match := _ID_SEARCH.match(text):
        q |= Q(pk=int(match.group(1)))
    if _HASH_PREFIX.match(text):
        q |= Q(args_hash__startswith=text)
    return q


def attempt_filter(query: ListQuery, user: Person, now: datetime, *, prefix: str = "") -> Q:
    """The list's filters as one condition on attempts: the queues, the
    search and the exports (which filter events by their attempt, with
    ``prefix="attempt__"``) all select the same attempts for the same query."""

    def q(**lookups: Any) -> Q:
        return Q(**{prefix + name: value for name, value in lookups.items()})

    condition = Q()
    if query.state:
        condition &= q(state=query.state)
    if query.awaiting_approval:
        condition &= rules.awaiting_approval_filter(prefix)
    if query.states:
        condition &= q(state__in=list(query.states))
    if query.past_sla:
        condition &= past_sla_filter(query.tenant_ids, now, prefix=prefix)
    if query.not_requested_by is not None:
        condition &= rules.four_eyes_filter(query.not_requested_by, prefix)
    if query.tool:
        condition &= q(tool_name=query.tool)
    if query.owner == "me":
        condition &= q(owner=user)
    elif query.owner == "unassigned":
        condition &= q(owner__isnull=True)
    if query.older_than is not None:
        condition &= q(created_at__lte=now - query.older_than)
    if query.newer_than is not None:
        condition &= q(created_at__gt=now - query.newer_than)
    if query.since is not None:
        condition &= q(created_at__gte=query.since)
    if query.until is not None:
        condition &= q(created_at__lt=query.until)
    if query.search:
        search = _search_filter(query.search)
        condition &= Q(**{prefix + "pk__in": Attempt.objects.filter(search).values("pk")}) if prefix else search
    return condition


def past_sla_filter(tenant_ids: Iterable[int], now: datetime, *, prefix: str = "") -> Q:
    """Attempts older than their own tenant's SLA (one cut-off per tenant)."""
    condition = Q(pk__in=[])
    for tenant in Tenant.objects.filter(pk__in=list(tenant_ids)).only("pk", "sla_minutes"):
        condition |= Q(**{f"{prefix}tenant_id": tenant.pk, f"{prefix}created_at__lte": now - tenant.sla})
    return condition


def _filtered(query: ListQuery, user: Person, now: datetime) -> QuerySet[Attempt]:
    return Attempt.objects.filter(attempt_filter(query, user, now))


def _beyond(qs: QuerySet[Attempt], cursor: Cursor, *, ascending: bool) -> QuerySet[Attempt]:
    # Rows strictly past the cursor in (created_at, id) order. The first
    # condition bounds the index range scan; the second only drops the
    # cursor's own timestamp's rows up to its id.
    if ascending:
        return qs.filter(created_at__gte=cursor.created_at).filter(
            Q(created_at__gt=cursor.created_at) | Q(id__gt=cursor.id)
        )
    return qs.filter(created_at__lte=cursor.created_at).filter(
        Q(created_at__lt=cursor.created_at) | Q(id__lt=cursor.id)
    )


def list_page(
    user: Person, query: ListQuery, *, now: datetime | None = None, allowed: Iterable[int] | None = None
) -> Page:
    """One page of attempts, by keyset on (created_at, id).

    Each of the user's tenants is read on its own, so every read is a range
    scan of one tenant's index that stops after a page; the pages are then
    merged. (One query over several tenants would have to sort all their
    matching rows before it could return the first page.) ``allowed``: the
    user's tenants, when the caller has read them already.
    """
    now = now or timezone.now()
    visible = set(allowed if allowed is not None else tenant_ids_for(user))
    tenant_ids = tuple(t for t in query.tenant_ids if t in visible)
    if not tenant_ids:
        return Page(rows=[])
    base = _filtered(query, user, now)
    # Walking backwards (to the previous page) reads in reverse display order.
    backwards = query.before is not None and query.after is None
    ascending = query.oldest_first != backwards
    order = ["created_at", "id"] if ascending else ["-created_at", "-id"]
    cursor = query.before if backwards else query.after
    if cursor is not None:
        base = _beyond(base, cursor, ascending=ascending)
    limit = query.page_size + 1
    merged = _keyset_reads(base, tenant_ids, order, limit)
    more = len(merged) > query.page_size
    merged = merged[: query.page_size]
    by_id = Attempt.objects.select_related("tenant", "owner").in_bulk([pk for _, pk in merged])
    rows = [by_id[pk] for _, pk in merged if pk in by_id]
    if backwards:
        rows.reverse()
    page = Page(rows=rows, tenant_ids=tenant_ids)
    if rows:
        first, last = Cursor.of(rows[0]), Cursor.of(rows[-1])
        if backwards:
            page.next_cursor = last
            page.prev_cursor = first if more else None
        else:
            page.next_cursor = last if more else None
            page.prev_cursor = first if cursor is not None else None
    return page


def _keyset_reads(
    base: QuerySet[Attempt], tenant_ids: tuple[int, ...], order: list[str], limit: int
) -> list[tuple[datetime, int]]:
    """The (created_at, id) of the first ``limit`` rows of ``base`` in
    ``order``, read tenant by tenant (each an index range scan that stops
    after ``limit`` rows), merged.

    On PostgreSQL that is one statement: the per-tenant read, compiled once,
    runs as a LATERAL subquery for each tenant id and the server merges the
    results (a Merge Append of index scans). Elsewhere, one query a tenant.
    """
    descending = order[0].startswith("-")
    if connection.vendor == "postgresql":
        per_tenant = base.filter(tenant_id=RawSQL("tenants.id", ())).order_by(*order)
        sql, params = per_tenant.values_list("created_at", "id")[:limit].query.sql_with_params()
        direction = "DESC" if descending else "ASC"
        # The ORM compiled the inner query; every value is a parameter.
        merged_sql = (
            f"SELECT page.* FROM unnest(%s::bigint[]) AS tenants (id) CROSS JOIN LATERAL ({sql}) AS page "  # noqa: S608
            f"ORDER BY 1 {direction}, 2 {direction} LIMIT %s"
        )
        with connection.cursor() as cursor:
            cursor.execute(merged_sql, [list(tenant_ids), *params, limit])
            return [(created_at, pk) for created_at, pk in cursor.fetchall()]
    keys: list[list[tuple[datetime, int]]] = [
        list(base.filter(tenant_id=tenant_id).order_by(*order).values_list("created_at", "id")[:limit])
        for tenant_id in tenant_ids
    ]
    return list(heapq.merge(*keys, reverse=descending))[:limit]


# --- one attempt ------------------------------------------------------------------


def chain_of(attempt: Attempt) -> list[Attempt]:
    """Every attempt at the same side effect (the root and its linked
    retries share the tenant and the key), oldest first."""
    return list(
        Attempt.objects.filter(tenant_id=attempt.tenant_id, idempotency_key=attempt.idempotency_key)
        .select_related("owner", "requested_by", "approved_by")
        .order_by("created_at", "id")
    )


def drill_runs_for(user: Person, *, tenant_ids: Iterable[int] | None = None) -> QuerySet[DrillRun]:
    """Crash-drill runs of the user's tenants (``tenant_ids``, when the caller
    has read them already), newest first."""
    return (
        DrillRun.objects.filter(tenant_id__in=list(tenant_ids) if tenant_ids is not None else tenant_ids_for(user))
        .select_related("tenant")
        .defer("report")
        .order_by("-started_at", "-id")
    )


# --- audit -----------------------------------------------------------------------------


def events_of_chain(attempts: list[Attempt]) -> list[AttemptEvent]:
    """Every event of these attempts (a linked chain), in the order they happened."""
    return events_of_attempts(attempts, AttemptEvent.objects.select_related("actor_user"))


@dataclass(frozen=True)
class ChainStatus:
    """A tenant's chain as the last ``verify_audit`` left it (a cached
    result: walking the chain on a page view would read every event)."""

    tenant: Tenant
    #: The head seq of each of the tenant's chains.
    heads: tuple[int, ...]
    check: ChainCheck | None

    @property
    def head_seq(self) -> int:
        return max(self.heads, default=0)

    @property
    def status(self) -> str:
        if self.check is None:
            return "unverified"
        return "verified" if self.check.ok else "broken"

    @property
    def appended_since(self) -> int:
        n = self.tenant.chain_stripes
        if n == 1:
            return max(0, self.head_seq - self.check.verified_seq) if self.check is not None else self.head_seq
        # Several chains number side by side: count each chain's events past where the walk reached.
        reached = dict.fromkeys(range(n), 0)
        for seq, _ in self.check.reached_heads if self.check is not None else []:
            reached[chain.stripe_of_seq(seq, n)] = seq
        return sum(
            max(0, chain.count_up_to(head, n) - chain.count_up_to(reached[stripe], n))
            for stripe, head in enumerate(self.heads)
        )


def chain_status(user: Person, *, tenants: list[Tenant] | None = None) -> list[ChainStatus]:
    """The user's tenants' chains (``tenants``, by slug, when the caller has read them already)."""
    if tenants is None:
        tenants = list(Tenant.objects.filter(pk__in=tenant_ids_for(user)).order_by("slug"))
    heads = chain_heads(tenants)
    checks = {c.tenant_id: c for c in ChainCheck.objects.filter(tenant__in=tenants)}
    return [ChainStatus(t, tuple(seq for seq, _ in heads[t.pk]), checks.get(t.pk)) for t in tenants]


# --- the overview: what to do first ----------------------------------------------


@dataclass(frozen=True)
class Oldest:
    """The oldest item of a queue: what waited longest."""

    label: str
    queue_url: str
    count: int
    since: datetime | None = None
    item_url: str = ""
    item_label: str = ""


@dataclass(frozen=True)
class Late:
    """A tenant's work past its SLA."""

    tenant: Tenant
    count: int
    sla: timedelta


@dataclass(frozen=True)
class FirstThings:
    oldest: list[Oldest]
    late: list[Late]
    mine: int
    my_approvals: int
    unowned: int
    duplicates: int


def _capped(qs: QuerySet[Any]) -> int:
    return qs.order_by().values("pk")[: COUNT_CAP + 1].count()


def first_things(
    user: Person, tenants: list[Tenant], approver_of: Iterable[int] | None = None, *, now: datetime | None = None
) -> FirstThings:
    """What an operator should look at first, in the user's tenants: the
    oldest item of each queue, work past each tenant's SLA, their own work,
    what awaits their approval, work nobody owns, and duplicate incidents.
    Every count stops at ``COUNT_CAP + 1``. ``approver_of``: the tenants
    where the user approves, when the caller has read them already."""
    from django.urls import reverse

    from ledgerdash.ledger.models import OWNED_STATES, Role

    now = now or timezone.now()
    tenant_ids = [t.pk for t in tenants]
    attempts = Attempt.objects.filter(tenant_id__in=tenant_ids)
    oldest: list[Oldest] = []
    sources: list[tuple[str, str, QuerySet[Attempt]]] = [
        ("UNKNOWN", reverse("reviews:queue", args=["unknown"]), attempts.filter(state=State.UNKNOWN)),
        ("MANUAL_REVIEW", reverse("reviews:queue", args=["review"]), attempts.filter(state=State.MANUAL_REVIEW)),
        ("Awaiting approval", reverse("reviews:approvals"), attempts.filter(rules.awaiting_approval_filter())),
    ]
    for label, url, qs in sources:
        first = qs.order_by("created_at", "id").values("pk", "created_at").first()
        oldest.append(
            Oldest(
                label,
                url + "?sort=oldest",
                _capped(qs),
                first["created_at"] if first else None,
                reverse("reviews:attempt", args=[first["pk"]]) if first else "",
                f"#{first['pk']}" if first else "",
            )
        )
    incidents = Incident.objects.filter(tenant_id__in=tenant_ids, status=Incident.Status.OPEN)
    first_incident = incidents.order_by("opened_at", "id").values("pk", "opened_at").first()
    oldest.append(
        Oldest(
            "Open incidents",
            reverse("reviews:incidents") + "?status=open",
            _capped(incidents),
            first_incident["opened_at"] if first_incident else None,
            reverse("reviews:incident", args=[first_incident["pk"]]) if first_incident else "",
            f"incident #{first_incident['pk']}" if first_incident else "",
        )
    )
    waiting = attempts.filter(state__in=list(OWNED_STATES))
    late = []
    for tenant in tenants:
        count = _capped(waiting.filter(tenant_id=tenant.pk, created_at__lte=now - tenant.sla))
        if count:
            late.append(Late(tenant, count, tenant.sla))
    approver_of = list(approver_of) if approver_of is not None else tenant_ids_for(user, Role.APPROVER)
    user_id = user.pk if user is not None else None
    awaiting_mine = Attempt.objects.filter(
        rules.awaiting_approval_filter(), rules.four_eyes_filter(user_id), tenant_id__in=approver_of
    )
    return FirstThings(
        oldest=oldest,
        late=late,
        mine=_capped(waiting.filter(owner_id=user_id)),
        my_approvals=_capped(awaiting_mine),
        unowned=_capped(waiting.filter(owner__isnull=True)),
        duplicates=_capped(incidents.filter(kind=Incident.Kind.DUPLICATE)),
    )
