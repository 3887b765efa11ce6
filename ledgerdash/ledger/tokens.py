"""API tokens: issue one (the secret is shown once), revoke it, authenticate with it.

A token reads ``ldk_<prefix>_<secret>``: the prefix (12 hex characters) is
public and finds the row; the secret (43 URL-safe characters, 256 random
bits) never leaves the caller. The ledger keeps sha256 of the whole token
and compares it in constant time. Issuing and revoking are recorded in the
tenant's event chain, so an audit shows who could write to the ledger when.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from ledgerdash.ledger import tenancy
from ledgerdash.ledger.errors import InvalidField, InvalidToken, TokenExpired, TokenRevoked
from ledgerdash.ledger.events import Actor, EventKind
from ledgerdash.ledger.models import ApiToken, Role, Tenant, TokenScope
from ledgerdash.ledger.store import event_record

TOKEN_PREFIX = "ldk_"  # noqa: S105 - the public marker every token starts with
PREFIX_HEX = 12
#: Longest token :func:`token_authenticate` will look at; anything longer is not ours.
MAX_TOKEN_LENGTH = 100
#: ``last_used_at`` is written at most this often per token.
TOUCH_EVERY = timedelta(seconds=60)
DEFAULT_LIFETIME = timedelta(days=90)


def _digest(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def _scopes(scopes: Iterable[str]) -> str:
    chosen = sorted(set(scopes))
    if not chosen:
        raise InvalidField(InvalidField.EMPTY.format(field="scopes"))
    unknown = [s for s in chosen if s not in TokenScope.values]
    if unknown:
        raise InvalidField(f"unknown token scope {', '.join(unknown)}; known: {', '.join(TokenScope.values)}")
    return " ".join(chosen)


def token_scopes(*, tenant: Tenant, scopes: Iterable[str], person: User | None) -> str:
    """The scopes as stored, once they make sense together: an
    ``approvals:decide`` token is a person's (an approver or admin of the
    tenant now) and never also writes; only such a token names a person."""
    scope_text = _scopes(scopes)
    chosen = scope_text.split()
    if TokenScope.DECIDE.value not in chosen:
        if person is not None:
            raise InvalidField("only an approvals:decide token acts for a person")
        return scope_text
    if person is None:
        raise InvalidField("an approvals:decide token acts for a person: name them")
    if TokenScope.WRITE.value in chosen:
        raise InvalidField(
            "an approvals:decide token cannot also have attempts:write: "
            "the token that records a call may not approve it (issue two tokens)"
        )
    refused = tenancy.refusal(person, tenant.pk, Role.APPROVER)
    if refused:
        raise InvalidField(f"{person.get_username()} cannot decide approvals in {tenant.slug}: {refused}")
    return scope_text


def token_create(
    *,
    tenant: Tenant,
    name: str,
    scopes: Iterable[str],
    actor: Actor,
    expires_at: datetime | None = None,
    person: User | None = None,
) -> tuple[ApiToken, str]:
    """Issue a token; returns the row and the token itself, which is not stored
    anywhere and cannot be shown again.

    An ``approvals:decide`` token is a person's (``person``, an approver or
    admin of the tenant now; their role is checked again at every decision)
    and cannot also write: the token that records a call never approves it."""
    name = name.strip()
    if not name:
        raise InvalidField(InvalidField.EMPTY.format(field="name"))
    scope_text = token_scopes(tenant=tenant, scopes=scopes, person=person)
    prefix = secrets.token_hex(PREFIX_HEX // 2)
    raw = f"{TOKEN_PREFIX}{prefix}_{secrets.token_urlsafe(32)}"
    with transaction.atomic():
        token = ApiToken.objects.create(
            tenant=tenant,
            name=name[:100],
            prefix=prefix,
            secret_hash=_digest(raw),
            scopes=scope_text,
            created_by_id=actor.user_id,
            expires_at=expires_at,
            person=person,
        )
        event_record(
            tenant=tenant,
            kind=EventKind.API_TOKEN,
            actor=actor,
            reason=f"API token {prefix} ({token.name}) issued with scopes {scope_text}",
            details={
                "prefix": prefix,
                "name": token.name,
                "scopes": scope_text,
                "person": person.get_username() if person is not None else None,
                "expires_at": expires_at.isoformat() if expires_at else None,
            },
        )
    return token, raw


def token_revoke(*, token: ApiToken, actor: Actor) -> ApiToken:
    """Revoke ``token`` now; revoking a revoked token changes nothing."""
    now = timezone.now()
    with transaction.atomic():
        changed = ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
            revoked_at=now, revoked_by_id=actor.user_id
        )
        if not changed:
            token.refresh_from_db()
            return token
        token.revoked_at, token.revoked_by_id = now, actor.user_id
        event_record(
            tenant=token.tenant_id,
            kind=EventKind.API_TOKEN,
            actor=actor,
            reason=f"API token {token.prefix} ({token.name}) revoked",
            details={"prefix": token.prefix, "name": token.name, "revoked": True},
        )
    token_forget_all()  # this worker refuses it from now on; the others within LEDGER_TOKEN_CACHE_SECONDS
    return token


def token_authenticate(raw: str, *, now: datetime | None = None) -> ApiToken:
    """The live token ``raw`` names, or a :class:`TokenError` saying why not.

    Revoked and expired are told apart only after the secret matched: saying
    so tells nothing to someone who does not already hold the token.
    """
    if len(raw) > MAX_TOKEN_LENGTH or not raw.startswith(TOKEN_PREFIX):
        raise InvalidToken(InvalidToken.MESSAGE)
    prefix, sep, secret = raw[len(TOKEN_PREFIX) :].partition("_")
    if not sep or not secret or len(prefix) != PREFIX_HEX or not all(c in "0123456789abcdef" for c in prefix):
        raise InvalidToken(InvalidToken.MESSAGE)
    token = ApiToken.objects.select_related("tenant").filter(prefix=prefix).first()
    if token is None or not hmac.compare_digest(token.secret_hash, _digest(raw)):
        raise InvalidToken(InvalidToken.MESSAGE)
    now = now or timezone.now()
    if token.revoked_at is not None:
        raise TokenRevoked(TokenRevoked.MESSAGE.format(prefix=prefix, at=token.revoked_at.isoformat()))
    if token.expires_at is not None and token.expires_at <= now:
        raise TokenExpired(TokenExpired.MESSAGE.format(prefix=prefix, at=token.expires_at.isoformat()))
    return token


# --- tokens checked recently, per worker process ------------------------------------
#
# Every API request presents its token; looking it up (and its tenant) on each
# one was a query per request on the hot path. A worker keeps a token it has
# checked for LEDGER_TOKEN_CACHE_SECONDS (default 5): a revocation, or a
# tenant deactivated, takes effect at once in the worker that made it and
# within that many seconds in every other. Expiry is checked on every request
# all the same, and a token that failed is never kept (each try is looked up).

#: Tokens kept at most; past it the cache starts again (a worker serves a few tenants' agents).
CACHE_MAX = 1024
_checked: dict[str, tuple[float, ApiToken]] = {}
_checked_lock = threading.Lock()


def _monotonic() -> float:
    return time.monotonic()


def token_forget_all() -> None:
    """Drop this worker's checked tokens (a revocation here takes effect at once)."""
    with _checked_lock:
        _checked.clear()


def token_authenticate_cached(raw: str, *, now: datetime | None = None) -> ApiToken:
    """:func:`token_authenticate`, answered from this worker's recent checks
    when it checked ``raw`` less than ``LEDGER_TOKEN_CACHE_SECONDS`` ago."""
    ttl = float(getattr(settings, "LEDGER_TOKEN_CACHE_SECONDS", 0))
    if ttl <= 0 or len(raw) > MAX_TOKEN_LENGTH:
        return token_authenticate(raw, now=now)
    key = _digest(raw)
    kept = _checked.get(key)
    if kept is not None and _monotonic() - kept[0] < ttl:
        token = kept[1]
        now = now or timezone.now()
        if token.expires_at is not None and token.expires_at <= now:
            raise TokenExpired(TokenExpired.MESSAGE.format(prefix=token.prefix, at=token.expires_at.isoformat()))
        return token
    token = token_authenticate(raw, now=now)
    with _checked_lock:
        if len(_checked) >= CACHE_MAX:
            _checked.clear()
        _checked[key] = (_monotonic(), token)
    return token


def token_touch(token: ApiToken, *, now: datetime | None = None) -> None:
    """Note that the token was used; one write a minute at most."""
    now = now or timezone.now()
    if token.last_used_at is not None and token.last_used_at > now - TOUCH_EVERY:
        return
    ApiToken.objects.filter(pk=token.pk).filter(
        Q(last_used_at__isnull=True) | Q(last_used_at__lte=now - TOUCH_EVERY)
    ).update(last_used_at=now)
    token.last_used_at = now
