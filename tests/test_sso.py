"""Single sign-on end to end against a real OpenID provider running beside the test
(tests/oidc_provider.py, Authlib): the authorize redirect, the person signing in at
the provider, the code exchanged for tokens, the ID token's signature checked
against the provider's published key, the user and their memberships created."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from ledgerdash.ledger.models import Membership, Tenant
from reviews.models import SsoIdentity
from tests.live import PYTHON, free_port, running

CLIENT_ID = "ledgerdash-tests"
CALLBACK = "http://testserver/oidc/callback/"
PEOPLE = [
    {"username": "dana", "password": "pw-dana", "sub": "sub-dana-1", "email": "dana@example.com",
     "groups": ["acme-ops", "acme-leads", "globex-all", "unrelated"]},
    {"username": "carol", "password": "pw-carol", "sub": "sub-carol-7", "email": "carol@example.com",
     "groups": ["acme-ops"]},
    {"username": "eve", "password": "pw-eve", "sub": "sub-eve-3", "email": "eve@example.com", "groups": ["unrelated"]},
]  # fmt: skip


class NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # the test follows the provider's redirect back itself


OPENER = urllib.request.build_opener(NoRedirects)


@pytest.fixture(scope="module")
def provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    config = tmp_path_factory.mktemp("oidc") / "provider.json"
    config.write_text(
        json.dumps(
            {
                "client_id": CLIENT_ID,
                "client_secret": "tests-only-client-secret",
                "redirect_uri": CALLBACK,
                "users": PEOPLE,
            }
        )
    )
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    command = [PYTHON, "-m", "tests.oidc_provider", "--port", str(port), "--config", str(config)]
    with running(command, url=base + "/.well-known/openid-configuration"):
        yield base


@pytest.fixture
def sso(provider: str, settings: Any, tenant_a: Tenant, tenant_b: Tenant) -> str:
    settings.OIDC_OP_ISSUER = provider
    settings.OIDC_OP_AUTHORIZATION_ENDPOINT = provider + "/authorize"
    settings.OIDC_OP_TOKEN_ENDPOINT = provider + "/token"
    settings.OIDC_OP_USER_ENDPOINT = provider + "/userinfo"
    settings.OIDC_OP_JWKS_ENDPOINT = provider + "/jwks"
    return provider


def _post(url: str, data: dict[str, str]) -> tuple[int, dict[str, str], str]:
    request = urllib.request.Request(url, data=urllib.parse.urlencode(data).encode())
    try:
        with OPENER.open(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


def sign_in(provider: str, client: Client, username: str, password: str) -> Any:
    """A person's whole sign-in: the dashboard, the provider's page, back to the dashboard."""
    start = client.get("/oidc/authenticate/")
    assert start.status_code == 302
    authorize = start["Location"]
    assert authorize.startswith(provider + "/authorize?")
    params = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(authorize).query))
    assert params["client_id"] == CLIENT_ID
    assert params["redirect_uri"] == CALLBACK
    assert params["code_challenge_method"] == "S256"
    assert params["nonce"]
    assert params["state"]
    with urllib.request.urlopen(authorize, timeout=10) as page:  # the provider's sign-in page
        assert 'name="password"' in page.read().decode()
    status, headers, _ = _post(provider + "/authorize", {**params, "username": username, "password": password})
    assert status == 302, status
    back = urllib.parse.urlsplit(headers["Location"])
    assert f"{back.scheme}://{back.netloc}{back.path}" == CALLBACK
    returned = dict(urllib.parse.parse_qsl(back.query))
    assert returned["state"] == params["state"]
    assert set(returned) == {"code", "state"}, returned  # no error from the provider
    return client.get(back.path, returned)  # the dashboard exchanges the code and checks the ID token


def signed_in_as(client: Client) -> Any:
    user_id = client.session.get("_auth_user_id")
    return get_user_model().objects.get(pk=user_id) if user_id else None


def roles(user: Any) -> dict[str, str]:
    return dict(Membership.objects.filter(user=user).values_list("tenant__slug", "role"))


def test_a_person_signs_in_through_the_provider_and_gets_the_roles_their_groups_grant(sso: str) -> None:
    client = Client()
    done = sign_in(sso, client, "dana", "pw-dana")
    assert done.status_code == 302
    assert done["Location"] == "/"
    user = signed_in_as(client)
    assert user is not None
    assert (user.username, user.email) == ("dana", "dana@example.com")
    assert (user.sso_identity.issuer, user.sso_identity.subject) == (sso, "sub-dana-1")
    assert not user.has_usable_password()
    assert roles(user) == {"acme": "approver", "globex": "viewer"}  # the highest role per tenant
    assert client.get("/").status_code == 200  # the dashboard, as dana


def test_each_sign_in_brings_the_memberships_in_line_with_the_groups(sso: str) -> None:
    sign_in(sso, Client(), "dana", "pw-dana")
    _post(sso + "/test/groups", {"username": "dana", "groups": "globex-all"})
    try:
        client = Client()
        assert sign_in(sso, client, "dana", "pw-dana").status_code == 302
        user = signed_in_as(client)
        assert roles(user) == {"globex": "viewer"}
        assert get_user_model().objects.filter(username__startswith="dana").count() == 1  # the same person
    finally:
        _post(sso + "/test/groups", {"username": "dana", "groups": "acme-ops acme-leads globex-all unrelated"})


def test_someone_whose_groups_grant_no_role_is_refused_and_nothing_is_created(sso: str) -> None:
    client = Client()
    refused = sign_in(sso, client, "eve", "pw-eve")
    assert refused.status_code == 302
    assert refused["Location"] == "/login/?sso=failed"
    assert signed_in_as(client) is None
    assert not get_user_model().objects.filter(email="eve@example.com").exists()
    page = client.get(refused["Location"]).content.decode()
    assert "Single sign-on did not sign you in" in page


def test_an_id_token_from_another_issuer_is_refused(sso: str, settings: Any) -> None:
    settings.OIDC_OP_ISSUER = "https://someone-else.example"
    client = Client()
    assert sign_in(sso, client, "dana", "pw-dana")["Location"] == "/login/?sso=failed"
    assert signed_in_as(client) is None
    assert not SsoIdentity.objects.exists()


def test_a_local_account_is_never_taken_over_and_still_signs_in_with_its_password(
    sso: str, make_user: Any, tenant_a: Tenant
) -> None:
    local = make_user("carol", email="carol@example.com", is_staff=True)
    Membership.objects.create(user=local, tenant=tenant_a, role="admin")
    client = Client()
    sign_in(sso, client, "carol", "pw-carol")
    person = signed_in_as(client)
    assert person.pk != local.pk
    assert person.username.startswith("carol-sso-")
    assert roles(person) == {"acme": "operator"}
    assert roles(local) == {"acme": "admin"}  # untouched
    breakglass = Client()
    response = breakglass.post("/login/", {"username": "carol", "password": "pw-carol", "next": "/"})
    assert response.status_code == 302
    assert signed_in_as(breakglass).pk == local.pk


def test_the_login_page_offers_single_sign_on_beside_the_password_form(client: Client) -> None:
    page = client.get("/login/").content.decode()
    assert 'href="/oidc/authenticate/"' in page
    assert 'name="password"' in page


def test_a_wrong_password_at_the_provider_signs_nobody_in(sso: str) -> None:
    client = Client()
    start = client.get("/oidc/authenticate/")
    params = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(start["Location"]).query))
    status, _, _ = _post(sso + "/authorize", {**params, "username": "dana", "password": "wrong"})
    assert status == 401
    assert signed_in_as(client) is None


def test_the_group_mapping_is_checked_at_start_up(settings: Any) -> None:
    from reviews.checks import single_sign_on_group_roles

    settings.OIDC_GROUP_ROLES = "acme-ops=acme:superuser"
    (error,) = single_sign_on_group_roles()
    assert error.id == "ledgerdash.E010"
    assert "role must be one of viewer, operator, approver, admin" in error.msg
    settings.OIDC_GROUP_ROLES = ""
    assert single_sign_on_group_roles()[0].id == "ledgerdash.E011"


def test_a_provider_that_cannot_be_reached_for_the_token_is_a_failed_sign_in_not_an_error(
    sso: str, settings: Any
) -> None:
    settings.OIDC_OP_TOKEN_ENDPOINT = f"http://127.0.0.1:{free_port()}/token"  # nothing listens there
    client = Client()
    assert sign_in(sso, client, "dana", "pw-dana")["Location"] == "/login/?sso=failed"
    assert signed_in_as(client) is None


def test_the_roles_single_sign_on_grants_and_removes_are_in_the_tenants_chains(
    sso: str, tenant_a: Tenant, tenant_b: Tenant
) -> None:
    from ledgerdash.ledger.models import AttemptEvent

    def membership_events(tenant: Tenant) -> list[AttemptEvent]:
        return list(AttemptEvent.objects.filter(tenant=tenant, kind="membership").order_by("seq"))

    sign_in(sso, Client(), "dana", "pw-dana")
    (granted,) = membership_events(tenant_a)
    assert (granted.actor_kind, granted.actor_label) == ("system", f"single sign-on {sso}")
    assert granted.details["after"] == {"user": "dana", "tenant": "acme", "role": "approver"}
    assert len(membership_events(tenant_b)) == 1

    _post(sso + "/test/groups", {"username": "dana", "groups": "globex-all"})
    try:
        sign_in(sso, Client(), "dana", "pw-dana")
    finally:
        _post(sso + "/test/groups", {"username": "dana", "groups": "acme-ops acme-leads globex-all unrelated"})
    removed = membership_events(tenant_a)[-1]
    assert (removed.details["change"], removed.details["before"]["role"]) == ("deleted", "approver")
    assert len(membership_events(tenant_a)) == 2
    assert len(membership_events(tenant_b)) == 1  # unchanged: no event
