"""Audit exports: attempts with their events, as CSV or NDJSON, streamed.

One row per event, in chain order (tenant, then ``seq``), with its attempt's
columns repeated on every row (empty for a tenant-level event such as a
policy change or an earlier export). The column set is :data:`COLUMNS`;
``docs/audit.md`` documents it. Every field the chain's content hash covers is in the
row, so ``scripts/verify_export.py`` can recompute each row's hashes offline.

Records (the ``record`` column):

- ``export``: the first row: who exported what, when, with which filters.
- ``event``: an event and its attempt.
- ``link``: an event the filters left out, reduced to its seq and hashes,
  written only when asked for (``links``) so a filtered export can still be
  walked from the first event to the chain head.
- ``head``: after each tenant's rows: the tenant's chain head (seq and hash)
  read when the export started. Every row is at or below it; a file without
  it was cut short. A tenant whose events are kept in several chains (see
  :mod:`ledgerdash.ledger.chain`) gets a head row per chain, in chain
  order, each with its chain's counts, and the ``export`` row says how many
  chains each such tenant keeps (``details.chains``).

Memory stays flat whatever the size: events are read in keyset chunks of
:data:`CHUNK` on the (tenant, seq) index and written out chunk by chunk.
Exporting is itself an audit event: each exported tenant's chain records
who, the filters, the format and the row count (after the head it carries).
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import BooleanField, Count, ExpressionWrapper, F, Q, QuerySet, TextField
from django.db.models.functions import Cast, Mod
from django.utils import timezone

from ledgerdash.ledger import chain
from ledgerdash.ledger.events import Actor, EventKind
from ledgerdash.ledger.models import Attempt, AttemptEvent, Tenant
from ledgerdash.ledger.queries import chain_heads, events_by_seq, per_chain
from ledgerdash.ledger.store import event_record
from reviews.queries import ListQuery, attempt_filter

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
FORMATS = ("csv", "ndjson")
CHUNK = 2000
#: Text is handed on once this much is buffered (and at the end).
FLUSH_BYTES = 256 * 1024

ATTEMPT_COLUMNS = (
    "attempt_id",
    "task_id",
    "tool_name",
    "idempotency_key",
    "args_hash",
    "args",
    "provider_key",
    "provider_request_id",
    "policy_version",
    "credential_scope",
    "state",
    "owner",
    "parent_id",
    "attempt_created_at",
)
EVENT_COLUMNS = (
    "event_seq",
    "event_id",
    "event_kind",
    "event_at",
    "actor_kind",
    "actor_user_id",
    "actor_label",
    "from_state",
    "to_state",
    "fence",
    "reason",
    "details",
    "content_hash",
    "prev_hash",
    "hash",
)
#: Columns added later, each at the end.
LATER_COLUMNS = ("approval_required",)
#: The stable column set, in order. New columns are only ever appended.
COLUMNS = ("record", "tenant", "tenant_id", *ATTEMPT_COLUMNS, *EVENT_COLUMNS, *LATER_COLUMNS)

#: A spreadsheet treats a cell starting with one of these as a formula
#: (OWASP "CSV injection"). Such cells get a leading single quote; so does a
#: cell that already starts with one, so that the quote can be taken off
#: again unambiguously (scripts/verify_export.py does).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "'")

# What is read per event: its own fields, then its attempt's (NULL for a
# tenant-level event). Values, not model instances: a million of them.
_EVENT_FIELDS = (
    "seq",
    "id",
    "attempt_id",
    "kind",
    "created_at",
    "actor_kind",
    "actor_user_id",
    "actor_label",
    "from_state",
    "to_state",
    "fence",
    "reason",
    "content_hash",
    "prev_hash",
    "hash",
)
_ATTEMPT_FIELDS = (
    "attempt__approval_required",
    "attempt__task_id",
    "attempt__tool_name",
    "attempt__idempotency_key",
    "attempt__args_hash",
    "attempt__provider_key",
    "attempt__provider_request_id",
    "attempt__policy_version",
    "attempt__credential_scope",
    "attempt__state",
    "attempt__owner__username",
    "attempt__parent_id",
    "attempt__created_at",
)


def neutralize(cell: str) -> str:
    """A CSV cell a spreadsheet will show as text, never run as a formula."""
    return "'" + cell if cell.startswith(FORMULA_STARTS) else cell


class RawJSON(str):
    """JSON text as the database stores it, written to a CSV cell as is:
    decoding and re-encoding every row's details and arguments is most of an
    export's work. (A JSON object's text starts with ``{``: nothing to
    neutralize.)"""


#: The JSON columns, read as their stored text.
_JSON_AS_TEXT = ("details", "args")


def compact_json(value: Any) -> str:
    """JSON in a cell: compact, keys sorted. Not RFC 8785 itself (the C
    encoder is many times faster); a verifier parses the cell and
    canonicalizes it, which gives the same hash."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class ExportRequest:
    """What to export, already authorized: the tenants are the requester's."""

    tenants: list[Tenant]
    format: str
    actor: Actor
    #: The list filters; None exports every event of the tenants (a full export).
    query: ListQuery | None = None
    #: Whom the "me" owner filter means.
    owner_user: Any = None
    #: Write filtered-out events as ``link`` rows (a filtered export that
    #: can be walked to the chain head).
    links: bool = False
    #: The filters as given, for the export row and the audit event.
    filters: dict[str, Any] = field(default_factory=dict)

    @property
    def full(self) -> bool:
        return self.query is None


@dataclass
class _Counts:
    """Rows written for one tenant: event and link rows, in total and per chain."""

    chains: int = 1
    events: int = 0
    links: int = 0
    per_chain: dict[int, list[int]] = field(default_factory=dict)

    def add(self, seq: int, *, event: bool) -> None:
        if event:
            self.events += 1
        else:
            self.links += 1
        tally = self.per_chain.setdefault(chain.stripe_of_seq(seq, self.chains), [0, 0])
        tally[0 if event else 1] += 1

    def of_chain(self, stripe: int) -> dict[str, int]:
        if self.chains == 1:
            return {"events": self.events, "links": self.links}
        events, links = self.per_chain.get(stripe, [0, 0])
        return {"chain": stripe, "events": events, "links": links}


class _Writer:
    """Turns records (dicts keyed by COLUMNS) into text, a chunk at a time."""

    def __init__(self, fmt: str) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"unknown export format {fmt!r}; use one of {', '.join(FORMATS)}")
        self.csv = fmt == "csv"
        self.buffer = io.StringIO()
        # LF line ends, as PostgreSQL's COPY writes them on the server-formatted path.
        self.writer = csv.writer(self.buffer, lineterminator="\n") if self.csv else None

    def header(self) -> None:
        if self.writer is not None:
            self.writer.writerow(COLUMNS)

    def add(self, record: dict[str, Any]) -> None:
        if self.writer is None:
            values = {name: record.get(name) for name in COLUMNS}
            for name in _JSON_AS_TEXT:
                text = values[name]
                if isinstance(text, RawJSON):
                    values[name] = json.loads(text)
            self.buffer.write(json.dumps(values, ensure_ascii=False))
            self.buffer.write("\n")
            return
        self.writer.writerow([_csv_cell(record.get(name)) for name in COLUMNS])

    def take(self) -> str:
        text = self.buffer.getvalue()
        self.buffer.seek(0)
        self.buffer.truncate()
        return text


def _csv_cell(value: Any) -> str:
    if value is None:
        return ""
    if value.__class__ is RawJSON:
        return value
    if value.__class__ is not str:
        value = compact_json(value) if isinstance(value, (dict, list)) else str(value)
    return "'" + value if value.startswith(FORMULA_STARTS) else value


def _event_record(row: dict[str, Any], tenant: Tenant) -> dict[str, Any]:
    record: dict[str, Any] = {
        "record": "event",
        "tenant": tenant.slug,
        "tenant_id": tenant.pk,
        "event_seq": row["seq"],
        "event_id": row["id"],
        "event_kind": row["kind"],
        "event_at": chain.timestamp(row["created_at"]),
        "attempt_id": row["attempt_id"],
    }
    for name in ("actor_kind", "actor_user_id", "actor_label", "from_state", "to_state", "fence", "reason"):
        record[name] = row[name]
    record["details"] = RawJSON(row["details_text"])
    record["content_hash"], record["prev_hash"], record["hash"] = row["content_hash"], row["prev_hash"], row["hash"]
    if row["attempt_id"] is not None:
        for column in ATTEMPT_COLUMNS[1:]:
            record[column] = row.get("attempt__" + column)
        record["args"] = RawJSON(row["args_text"])
        record["owner"] = row["attempt__owner__username"]
        record["attempt_created_at"] = chain.timestamp(row["attempt__created_at"])
        record["approval_required"] = row["attempt__approval_required"]
    return record


def _link_record(row: dict[str, Any], tenant: Tenant) -> dict[str, Any]:
    return {
        "record": "link",
        "tenant": tenant.slug,
        "tenant_id": tenant.pk,
        "event_seq": row["seq"],
        "content_hash": row["content_hash"],
        "prev_hash": row["prev_hash"],
        "hash": row["hash"],
    }


def _up_to(tenant: Tenant, heads: list[tuple[int, str]]) -> QuerySet[AttemptEvent]:
    """The tenant's events up to its chains' heads (one per chain, in chain order)."""
    return per_chain(AttemptEvent.objects.filter(tenant_id=tenant.pk), [seq for seq, _ in heads], "lte")


def _chain_rows(
    request: ExportRequest, tenant: Tenant, heads: list[tuple[int, str]], now: datetime
) -> Iterator[dict[str, Any]]:
    """The tenant's events up to its chains' heads in seq order, by keyset
    chunks; each row says whether the filters include it."""
    qs = _up_to(tenant, heads).annotate(
        details_text=Cast("details", TextField()), args_text=Cast("attempt__args", TextField())
    )
    fields: tuple[str, ...] = (*_EVENT_FIELDS, *_ATTEMPT_FIELDS, "details_text", "args_text")
    if request.query is not None:
        condition = attempt_filter(request.query, request.owner_user, now, prefix="attempt__")
        if request.links:
            qs = qs.annotate(included=ExpressionWrapper(condition, output_field=BooleanField()))
            fields += ("included",)
        else:
            qs = qs.filter(condition & Q(attempt__isnull=False))
    return events_by_seq(qs, fields, chunk=CHUNK)


# --- a full CSV export on PostgreSQL: the server formats the cells ------------------------
#
# Formatting a million rows cell by cell in Python is most of an export's
# cost. For a full CSV export on PostgreSQL the server renders every cell
# exactly as _event_record and _csv_cell would (text, neutralized, timestamps
# as chain.timestamp writes them, JSON as stored) and
# streams them out with COPY … TO STDOUT WITH CSV, which also quotes them.
# tests/test_exports.py checks both paths give the same cells.

#: A cell starting with one of FORMULA_STARTS, as a PostgreSQL regular expression.
_FORMULA_START_RE = r"'^[=+@''\t\r-]'"


def _cell(expression: str) -> str:
    """SQL for a text cell, neutralized against formula injection like :func:`neutralize`."""
    return f"CASE WHEN {expression} ~ {_FORMULA_START_RE} THEN '''' || {expression} ELSE {expression} END"


def _instant(expression: str) -> str:
    """SQL for a timestamp as :func:`ledgerdash.ledger.chain.timestamp` writes it."""
    return f"""to_char({expression} AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US') || '+00:00'"""


_FORMATTED_CELLS = {
    "record": "'event'",
    "tenant": "%(tenant)s",
    "tenant_id": "%(tenant_id)s",
    "attempt_id": "e.attempt_id::text",
    "task_id": _cell("a.task_id"),
    "tool_name": _cell("a.tool_name"),
    "idempotency_key": _cell("a.idempotency_key"),
    "args_hash": _cell("a.args_hash"),
    "args": "a.args::text",
    "provider_key": _cell("a.provider_key"),
    "provider_request_id": _cell("a.provider_request_id"),
    "policy_version": "a.policy_version::text",
    "credential_scope": _cell("a.credential_scope"),
    "state": _cell("a.state"),
    "owner": _cell("u.username"),
    "parent_id": "a.parent_id::text",
    "attempt_created_at": _instant("a.created_at"),
    "event_seq": "e.seq::text",
    "event_id": "e.id::text",
    "event_kind": _cell("e.kind"),
    "event_at": _instant("e.created_at"),
    "actor_kind": _cell("e.actor_kind"),
    "actor_user_id": "e.actor_user_id::text",
    "actor_label": _cell("e.actor_label"),
    "from_state": _cell("e.from_state"),
    "to_state": _cell("e.to_state"),
    "fence": "e.fence::text",
    "reason": _cell("e.reason"),
    "details": "e.details::text",
    "content_hash": "e.content_hash",
    "prev_hash": "e.prev_hash",
    "hash": "e.hash",
    "approval_required": _cell("a.approval_required"),
}
assert tuple(_FORMATTED_CELLS) == COLUMNS, "the server's cells must follow COLUMNS"

_FORMATTED_QUERY = """
SELECT {cells}
FROM {event} e
LEFT JOIN {attempt} a ON a.id = e.attempt_id
LEFT JOIN {user} u ON u.id = a.owner_id
WHERE e.tenant_id = %(tenant_id_value)s AND e.seq <= (%(heads)s::bigint[])[(e.seq - 1) %% %(chains)s + 1]
ORDER BY e.seq
"""


def _server_formats(request: ExportRequest) -> bool:
    return request.format == "csv" and request.query is None and connection.vendor == "postgresql"


def _formatted_chain_text(tenant: Tenant, heads: list[tuple[int, str]], counts: _Counts) -> Iterator[str]:
    """A full export's event rows up to its chains' heads as CSV text,
    streamed by ``COPY (…) TO STDOUT WITH CSV``: the server formats and
    quotes, this process passes blocks on (memory stays flat)."""
    query = _FORMATTED_QUERY.format(
        cells=",\n       ".join(_FORMATTED_CELLS.values()),
        event=AttemptEvent._meta.db_table,
        attempt=Attempt._meta.db_table,
        user=get_user_model()._meta.db_table,
    )
    params = {
        "tenant": neutralize(tenant.slug),
        "tenant_id": str(tenant.pk),
        "tenant_id_value": tenant.pk,
        "heads": [seq for seq, _ in heads],
        "chains": len(heads),
    }
    decoder = codecs.getincrementaldecoder("utf-8")()
    pending: list[str] = []
    size = 0
    with connection.cursor() as cursor, cursor.cursor.copy(f"COPY ({query}) TO STDOUT WITH CSV", params) as copy:
        for block in copy:
            text = decoder.decode(bytes(block))
            pending.append(text)
            size += len(text)
            if size >= FLUSH_BYTES:
                yield "".join(pending)
                pending, size = [], 0
    yield "".join(pending) + decoder.decode(b"", final=True)
    # What COPY wrote, counted by the index rather than by parsing the CSV.
    if len(heads) == 1:
        counts.events += _up_to(tenant, heads).count()
        return
    by_chain = _up_to(tenant, heads).values(part=Mod(F("seq") - 1, len(heads))).annotate(rows=Count("id"))
    for stripe, rows in by_chain.values_list("part", "rows"):
        counts.events += rows
        counts.per_chain[stripe] = [rows, 0]


def stream(request: ExportRequest) -> Iterator[str]:
    """The export as text chunks. The audit events are written when the last
    chunk has been produced (or, if the reader goes away, with what was sent)."""
    now = timezone.now()
    writer = _Writer(request.format)
    writer.header()
    heads = chain_heads(request.tenants)
    counts = {t.pk: _Counts(chains=t.chain_stripes) for t in request.tenants}
    chains = {t.slug: t.chain_stripes for t in request.tenants if t.chain_stripes > 1}
    writer.add(
        {
            "record": "export",
            "reason": f"audit export by {request.actor.label}",
            "event_at": chain.timestamp(now),
            "actor_kind": request.actor.kind,
            "actor_user_id": request.actor.user_id,
            "actor_label": request.actor.label,
            "details": {
                "format_version": FORMAT_VERSION,
                "scope": "full" if request.full else ("filtered with links" if request.links else "filtered"),
                "filters": request.filters,
                "tenants": [t.slug for t in request.tenants],
                **({"chains": chains} if chains else {}),
            },
        }
    )
    server_formats = _server_formats(request)
    complete = False
    try:
        for tenant in request.tenants:
            tenant_heads = heads[tenant.pk]
            tally = counts[tenant.pk]
            if server_formats:
                yield writer.take()
                yield from _formatted_chain_text(tenant, tenant_heads, tally)
            else:
                for row in _chain_rows(request, tenant, tenant_heads, now):
                    included = row.get("included", True)
                    writer.add(_event_record(row, tenant) if included else _link_record(row, tenant))
                    tally.add(row["seq"], event=included)
                    if writer.buffer.tell() > FLUSH_BYTES:
                        yield writer.take()
            for stripe, (head_seq, head_hash) in enumerate(tenant_heads):
                writer.add(
                    {
                        "record": "head",
                        "tenant": tenant.slug,
                        "tenant_id": tenant.pk,
                        "event_seq": head_seq,
                        "hash": head_hash,
                        "details": tally.of_chain(stripe),
                    }
                )
        complete = True
        yield writer.take()
    finally:
        try:
            _record_exports(request, counts, heads, complete=complete)
        except Exception:
            # A response's closers may not raise (Django drops what they do):
            # a lost audit event must at least be in the log.
            log.exception("could not record the export by %s in the ledger", request.actor.label)
            raise


def _record_exports(
    request: ExportRequest, counts: dict[int, _Counts], heads: dict[int, list[tuple[int, str]]], *, complete: bool
) -> None:
    for tenant in request.tenants:
        tally = counts[tenant.pk]
        tenant_heads = heads[tenant.pk]
        if len(tenant_heads) == 1:
            (head_seq, head_hash), more = tenant_heads[0], {}
        else:  # the newest head, and every chain's
            (head_seq, head_hash), more = max(tenant_heads), {"heads": [list(head) for head in tenant_heads]}
        what = "exported" if complete else "export interrupted after"
        event_record(
            tenant=tenant,
            kind=EventKind.EXPORT,
            actor=request.actor,
            reason=f"{what} {tally.events} event rows of {tenant.slug} as {request.format}",
            details={
                "format": request.format,
                "filters": request.filters,
                "rows": tally.events,
                "links": tally.links,
                "complete": complete,
                "head_seq": head_seq,
                "head_hash": head_hash,
                **more,
            },
        )
