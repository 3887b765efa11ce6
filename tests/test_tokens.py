"""API tokens: issued once, kept as a hash, revoked and expired, managed in
the admin and from the command line, and recorded in the tenant's chain."""

from __future__ import annotations

import hashlib
import io
import re
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone

from ledgerdash.ledger.errors import InvalidField, InvalidToken, TokenExpired, TokenRevoked
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import ApiToken, AttemptEvent, Tenant
from ledgerdash.ledger.tokens import token_authenticate, token_authenticate_cached, token_create, token_revoke
from tests.api_support import READ, WRITE, Api, intent

SYSTEM = Actor.system("tests")


def test_a_token_is_stored_only_as_its_hash(tenant_a: Tenant) -> None:
    token, raw = token_create(tenant=tenant_a, name="billing agent", scopes=[WRITE], actor=SYSTEM)
    assert re.fullmatch(r"ldk_[0-9a-f]{12}_[A-Za-z0-9_-]{43}", raw)
    assert raw.startswith(f"ldk_{token.prefix}_")
    stored = ApiToken.objects.filter(pk=token.pk).values()[0]
    assert raw.split("_", 2)[2] not in str(stored)
    assert stored["secret_hash"] == hashlib.sha256(raw.encode()).hexdigest()
    assert token_authenticate(raw).pk == token.pk


def test_issuing_and_revoking_are_recorded_in_the_tenants_chain(tenant_a: Tenant) -> None:
    token, _ = token_create(tenant=tenant_a, name="agent", scopes=[READ], actor=SYSTEM)
    token_revoke(token=token, actor=SYSTEM)
    token_revoke(token=token, actor=SYSTEM)  # a no-op the second time
    reasons = list(AttemptEvent.objects.filter(tenant=tenant_a, kind="api_token").values_list("reason", flat=True))
    assert reasons == [
        f"API token {token.prefix} (agent) issued with scopes attempts:read",
        f"API token {token.prefix} (agent) revoked",
    ]


def test_revoked_expired_and_unknown_tokens_are_refused(tenant_a: Tenant) -> None:
    token, raw = token_create(tenant=tenant_a, name="a", scopes=[READ], actor=SYSTEM)
    _, old = token_create(
        tenant=tenant_a, name="b", scopes=[READ], actor=SYSTEM, expires_at=timezone.now() + timedelta(hours=1)
    )
    assert token_authenticate(old)
    with pytest.raises(TokenExpired):
        token_authenticate(old, now=timezone.now() + timedelta(hours=2))
    token_revoke(token=token, actor=SYSTEM)
    with pytest.raises(TokenRevoked):
        token_authenticate(raw)
    for bad in ["", "ldk_", "ldk_zzzzzzzzzzzz_x", "ldk_" + token.prefix, raw + "x", "x" * 1000]:
        with pytest.raises(InvalidToken):
            token_authenticate(bad)


def test_a_worker_looks_a_token_up_once_per_cache_period(
    tenant_a: Tenant, kept_for_5s: list[float], django_assert_num_queries: Any
) -> None:
    _, raw = token_create(tenant=tenant_a, name="a", scopes=[READ], actor=SYSTEM)
    with django_assert_num_queries(1):
        token_authenticate_cached(raw)
    with django_assert_num_queries(0):
        assert token_authenticate_cached(raw).tenant == tenant_a
    kept_for_5s[0] += 5
    with django_assert_num_queries(1):
        token_authenticate_cached(raw)


def test_a_revocation_elsewhere_takes_effect_within_the_cache_period(
    tenant_a: Tenant, kept_for_5s: list[float]
) -> None:
    token, raw = token_create(tenant=tenant_a, name="a", scopes=[READ], actor=SYSTEM)
    token_authenticate_cached(raw)
    # Another worker revokes it: this one still knows it as live, for at most 5 s.
    ApiToken.objects.filter(pk=token.pk).update(revoked_at=timezone.now())
    kept_for_5s[0] += 4.9
    assert token_authenticate_cached(raw)
    kept_for_5s[0] += 0.2
    with pytest.raises(TokenRevoked):
        token_authenticate_cached(raw)


def test_a_revocation_in_this_worker_and_an_expiry_take_effect_at_once(
    tenant_a: Tenant, kept_for_5s: list[float]
) -> None:
    token, raw = token_create(tenant=tenant_a, name="a", scopes=[READ], actor=SYSTEM)
    _, expiring = token_create(
        tenant=tenant_a, name="b", scopes=[READ], actor=SYSTEM, expires_at=timezone.now() + timedelta(hours=1)
    )
    token_authenticate_cached(raw)
    token_authenticate_cached(expiring)
    with pytest.raises(TokenExpired):
        token_authenticate_cached(expiring, now=timezone.now() + timedelta(hours=2))
    token_revoke(token=token, actor=SYSTEM)
    with pytest.raises(TokenRevoked):
        token_authenticate_cached(raw)
    # A token that failed is never kept: each try is looked up again.
    for _ in range(2):
        with pytest.raises(InvalidToken):
            token_authenticate_cached(raw + "x")


def test_a_token_needs_a_name_and_known_scopes(tenant_a: Tenant) -> None:
    with pytest.raises(InvalidField):
        token_create(tenant=tenant_a, name=" ", scopes=[READ], actor=SYSTEM)
    with pytest.raises(InvalidField):
        token_create(tenant=tenant_a, name="x", scopes=[], actor=SYSTEM)
    with pytest.raises(InvalidField):
        token_create(tenant=tenant_a, name="x", scopes=["attempts:delete"], actor=SYSTEM)
    assert not ApiToken.objects.exists()


# --- the admin ----------------------------------------------------------------------------


@pytest.fixture
def admin_client(make_user: Any) -> Client:
    client = Client()
    client.force_login(make_user("root", is_staff=True, is_superuser=True))
    return client


def test_the_admin_issues_a_token_and_shows_it_once(admin_client: Client, tenant_a: Tenant) -> None:
    page = admin_client.get("/admin/ledger/apitoken/add/")
    assert page.status_code == 200
    response = admin_client.post(
        "/admin/ledger/apitoken/add/",
        {"tenant": tenant_a.pk, "name": "billing agent", "scopes": [WRITE], "expires_at_0": "", "expires_at_1": ""},
    )
    assert response.status_code == 200, response.content[:2000]
    assert "no-store" in response["Cache-Control"]
    raw = re.search(rb"ldk_[0-9a-f]{12}_[A-Za-z0-9_-]{43}", response.content)
    assert raw is not None
    token = ApiToken.objects.get()
    assert token.name == "billing agent"
    assert token.scopes == WRITE
    assert token.expires_at is None
    assert Api(raw.group().decode()).post("/attempts", intent()).status_code == 201
    # ...and never again: the token's own page shows its prefix, not the secret.
    detail = admin_client.get(f"/admin/ledger/apitoken/{token.pk}/change/")
    assert detail.status_code == 200
    assert token.prefix.encode() in detail.content
    assert raw.group() not in detail.content


def test_the_admin_revokes_tokens_from_the_list(admin_client: Client, tenant_a: Tenant) -> None:
    token, raw = token_create(tenant=tenant_a, name="leaked", scopes=[WRITE], actor=SYSTEM)
    response = admin_client.post(
        "/admin/ledger/apitoken/", {"action": "revoke", "_selected_action": [token.pk]}, follow=True
    )
    assert response.status_code == 200
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert Api(raw).post("/attempts", intent()).json()["code"] == "token_revoked"


def test_the_admin_neither_edits_nor_deletes_tokens(admin_client: Client, tenant_a: Tenant) -> None:
    token, _ = token_create(tenant=tenant_a, name="x", scopes=[READ], actor=SYSTEM)
    assert admin_client.post(f"/admin/ledger/apitoken/{token.pk}/change/", {"name": "y"}).status_code == 403
    assert admin_client.get(f"/admin/ledger/apitoken/{token.pk}/delete/").status_code == 403


# --- the commands -------------------------------------------------------------------------


def test_the_command_prints_a_working_token_once(tenant_a: Tenant) -> None:
    out, err = io.StringIO(), io.StringIO()
    call_command("create_api_token", "--tenant", "acme", "--name", "cli agent", stdout=out, stderr=err)
    raw = out.getvalue().strip()
    token = ApiToken.objects.get()
    assert raw.startswith(f"ldk_{token.prefix}_")
    assert token.scope_set == {READ, WRITE}
    assert token.expires_at is not None
    assert token.expires_at > timezone.now() + timedelta(days=89)
    assert "shown only now" in err.getvalue()
    assert Api(raw).get("/attempts").status_code == 200


def test_the_command_takes_scopes_and_lifetimes(tenant_a: Tenant) -> None:
    call_command(
        "create_api_token", "--tenant", "acme", "--name", "r", "--scope", READ, "--no-expiry", stdout=io.StringIO()
    )
    token = ApiToken.objects.get()
    assert token.scopes == READ
    assert token.expires_at is None
    with pytest.raises(CommandError):
        call_command("create_api_token", "--tenant", "nope", "--name", "x", stdout=io.StringIO())


def test_the_revoke_command_takes_a_prefix_or_the_whole_token(tenant_a: Tenant) -> None:
    token, raw = token_create(tenant=tenant_a, name="x", scopes=[READ], actor=SYSTEM)
    out = io.StringIO()
    call_command("revoke_api_token", raw, stdout=out)
    assert "is now revoked" in out.getvalue()
    call_command("revoke_api_token", token.prefix, stdout=out)
    assert "was already revoked" in out.getvalue()
    with pytest.raises(CommandError):
        call_command("revoke_api_token", "000000000000", stdout=out)
