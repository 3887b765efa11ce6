"""Sign-in throttling: an account locks after repeated failures on the dashboard's
login and /admin/ alike, says so on the login page, is unlocked by an admin of
one of its tenants, and every lockout and unlock is an event in those tenants' chains."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.test import Client
from django.urls import reverse

from ledgerdash.ledger.models import AttemptEvent, Membership, Tenant
from tests.conftest import as_user, member

LOGIN = "/login/"
ADMIN_LOGIN = "/admin/login/"
LIMIT = settings.AXES_FAILURE_LIMIT


def sign_in(client: Client, username: str, password: str, path: str = LOGIN) -> Any:
    return client.post(path, {"username": username, "password": password, "next": "/"})


def signed_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


@pytest.fixture
def person(make_user: Any, tenant_a: Tenant, tenant_b: Tenant) -> Any:
    """An operator of both tenants (password pw-person)."""
    user = member(make_user, "person", tenant_a, "operator")
    Membership.objects.create(user=user, tenant=tenant_b, role="viewer")
    return user


def lock(username: str, path: str = LOGIN) -> list[int]:
    client = Client()
    return [sign_in(client, username, "wrong", path).status_code for _ in range(LIMIT)]


def test_it_locks_an_account_after_the_failure_limit_and_then_refuses_the_right_password(person: Any) -> None:
    statuses = lock("person")
    assert statuses == [200] * (LIMIT - 1) + [429]
    client = Client()
    for _ in range(3):  # more attempts change nothing
        assert sign_in(client, "person", "wrong").status_code == 429
    refused = sign_in(client, "person", "pw-person")
    assert refused.status_code == 429
    assert not signed_in(client)
    page = refused.content.decode()
    assert "Too many failed sign-ins for this account: it is locked until" in page
    assert "An admin of your tenant can unlock it sooner." in page
    assert 'name="password"' in page  # still the login page


def test_the_admin_site_shares_the_lock(person: Any, make_user: Any) -> None:
    person.is_staff = True
    person.save(update_fields=["is_staff"])
    assert lock("person", ADMIN_LOGIN)[-1] == 429
    client = Client()
    assert sign_in(client, "person", "pw-person").status_code == 429  # locked on /admin/, locked here too
    assert sign_in(client, "person", "pw-person", ADMIN_LOGIN).status_code == 429
    assert not signed_in(client)


def test_a_success_below_the_limit_starts_the_count_again(person: Any) -> None:
    client = Client()
    for _ in range(LIMIT - 1):
        assert sign_in(client, "person", "wrong").status_code == 200
    assert sign_in(client, "person", "pw-person").status_code == 302
    client = Client()
    for _ in range(LIMIT - 1):
        assert sign_in(client, "person", "wrong").status_code == 200
    assert sign_in(client, "person", "pw-person").status_code == 302


def test_a_lockout_is_one_event_in_each_of_the_accounts_tenants(
    person: Any, tenant_a: Tenant, tenant_b: Tenant, make_user: Any
) -> None:
    lock("person")
    lock("person")  # refused attempts during the lock write nothing more
    for tenant in (tenant_a, tenant_b):
        (event,) = AttemptEvent.objects.filter(tenant=tenant, kind="account_locked")
        assert (event.actor_kind, event.actor_label) == ("system", "sign-in throttling")
        assert event.details["username"] == "person"
        assert event.details["failures"] == LIMIT
        assert event.reason == f"person locked out after {LIMIT} failed sign-ins"
    make_user("nobody-s-member")
    lock("nobody-s-member")
    lock("no-such-user")
    assert AttemptEvent.objects.filter(kind="account_locked").count() == 2


def test_a_tenant_admin_sees_and_unlocks_a_locked_member(
    person: Any, admin_a: Any, tenant_a: Tenant, tenant_b: Tenant
) -> None:
    lock("person")
    admin = as_user(admin_a)
    page = admin.get(reverse("reviews:members")).content.decode()
    assert "locked" in page.split('id="member-person"')[1].split("</tr>")[0]
    assert 'href="/members/"' in admin.get(reverse("reviews:home")).content.decode()
    response = admin.post(reverse("reviews:member_unlock"), {"username": "person"})
    assert response.status_code == 302
    client = Client()
    assert sign_in(client, "person", "pw-person").status_code == 302
    assert signed_in(client)
    for tenant in (tenant_a, tenant_b):
        (event,) = AttemptEvent.objects.filter(tenant=tenant, kind="account_unlocked")
        assert (event.actor_kind, event.actor_user_id) == ("user", admin_a.pk)
        assert event.details["username"] == "person"
        assert event.details["attempts_cleared"] >= 1


def test_only_an_admin_of_one_of_the_accounts_tenants_may_unlock_it(
    person: Any, operator_a: Any, make_user: Any, tenant_b: Tenant
) -> None:
    lock("person")
    assert as_user(operator_a).get(reverse("reviews:members")).status_code == 403
    assert as_user(operator_a).post(reverse("reviews:member_unlock"), {"username": "person"}).status_code == 403
    stranger = member(make_user, "admin-c", Tenant.objects.create(slug="initech", name="Initech"), "admin")
    assert as_user(stranger).post(reverse("reviews:member_unlock"), {"username": "person"}).status_code == 403
    assert "person" not in as_user(stranger).get(reverse("reviews:members")).content.decode()
    assert as_user(operator_a).get(reverse("reviews:members")).status_code == 403
    assert sign_in(Client(), "person", "pw-person").status_code == 429  # still locked
    assert not AttemptEvent.objects.filter(kind="account_unlocked").exists()


def test_unlocking_needs_a_post(admin_a: Any) -> None:
    assert as_user(admin_a).get(reverse("reviews:member_unlock")).status_code == 405
