"""Single sign-on with OpenID Connect (mozilla-django-oidc), tenant roles from the provider's groups.

Optional (``OIDC_ENABLED``): local accounts keep working beside it, so an
operator can still sign in with a password when the identity provider is
down (break-glass). What the provider vouches for decides who someone is
and what they may do:

- a person is found by the ID token's issuer and subject (``SsoIdentity``),
  never by e-mail: an address someone may set at the provider must not open
  a local account that happens to share it;
- the ID token must be signed by the provider's published key (checked by
  mozilla-django-oidc) and name this provider as its issuer and this client
  in its audience (checked here: the library leaves both to its users); the
  UserInfo answer must be about the same subject;
- memberships follow the groups claim on every sign-in through
  ``OIDC_GROUP_ROLES`` (``group=tenant:role``, the highest role per
  tenant): granted, changed, or removed to match. Someone whose groups map
  to no tenant is refused. Accounts the provider created get no password.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from typing import Any

import requests
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import SuspiciousOperation
from django.db import transaction
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from ledgerdash.ledger.configuration import acting_as
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import ROLE_RANK, Membership, Role, Tenant
from reviews.models import SsoIdentity

log = logging.getLogger(__name__)


def parse_group_roles(text: str) -> dict[str, list[tuple[str, str]]]:
    """``group=tenant:role,…`` as {group: [(tenant, role)]}; ValueError naming what is wrong."""
    mapping: dict[str, list[tuple[str, str]]] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        group, sep, grant = item.rpartition("=")
        tenant, colon, role = grant.partition(":")
        if not sep or not group or not colon or not tenant:
            raise ValueError(f"{item!r} is not group=tenant:role")
        if role not in Role.values:
            raise ValueError(f"{item!r}: role must be one of {', '.join(Role.values)}")
        mapping.setdefault(group, []).append((tenant, role))
    return mapping


@functools.cache
def _group_roles(text: str) -> dict[str, list[tuple[str, str]]]:
    return parse_group_roles(text)


def roles_from_claims(claims: dict[str, Any]) -> dict[str, str]:
    """{tenant slug: role} the claims' groups grant: the highest role per tenant."""
    groups = claims.get(settings.OIDC_GROUPS_CLAIM) or []
    if isinstance(groups, str):
        groups = [groups]
    mapping = _group_roles(settings.OIDC_GROUP_ROLES)  # checked at start-up: reviews/checks.py
    granted: dict[str, str] = {}
    for group in groups:
        for tenant, role in mapping.get(str(group), []):
            if tenant not in granted or ROLE_RANK[Role(role)] > ROLE_RANK[Role(granted[tenant])]:
                granted[tenant] = role
    return granted


class TenantRolesBackend(OIDCAuthenticationBackend):
    def authenticate(self, request: Any, **kwargs: Any) -> Any:
        try:
            return super().authenticate(request, **kwargs)
        except (requests.RequestException, SuspiciousOperation) as exc:
            # The provider is down, refused the code, or sent a token this
            # client must not accept: a failed sign-in (back to the login
            # page, where local accounts still work), not an error page.
            log.warning("single sign-on failed: %s", exc)
            return None

    def verify_token(self, token: str, **kwargs: Any) -> dict[str, Any]:
        payload: dict[str, Any] = super().verify_token(token, **kwargs)
        if "nonce" not in kwargs:
            return payload  # a signed UserInfo answer, not an ID token
        if payload.get("iss") != settings.OIDC_OP_ISSUER:
            raise SuspiciousOperation(f"ID token from issuer {payload.get('iss')!r}, not {settings.OIDC_OP_ISSUER!r}")
        audience = payload.get("aud")
        audiences = [audience] if isinstance(audience, str) else list(audience or [])
        if self.OIDC_RP_CLIENT_ID not in audiences:
            raise SuspiciousOperation("ID token is not for this client (aud)")
        if len(audiences) > 1 and payload.get("azp") != self.OIDC_RP_CLIENT_ID:
            raise SuspiciousOperation("ID token for several audiences without this client as azp")
        if not payload.get("sub"):
            raise SuspiciousOperation("ID token without a subject")
        return payload

    def get_userinfo(self, access_token: str, id_token: str, payload: dict[str, Any]) -> dict[str, Any]:
        info: dict[str, Any] = super().get_userinfo(access_token, id_token, payload)
        if info.get("sub") != payload.get("sub"):
            raise SuspiciousOperation("the UserInfo answer is about another subject than the ID token")
        # The ID token's issuer identifies the person with its subject.
        return {**info, "iss": payload["iss"]}

    def describe_user_by_claims(self, claims: dict[str, Any]) -> str:
        return f"subject {claims.get('sub')!r} of {claims.get('iss')!r}"

    def verify_claims(self, claims: dict[str, Any]) -> bool:
        if not roles_from_claims(claims):
            log.warning(
                "single sign-on refused: %s has no group that maps to a tenant role",
                self.describe_user_by_claims(claims),
            )
            return False
        return True

    def filter_users_by_claims(self, claims: dict[str, Any]) -> Any:
        return get_user_model().objects.filter(sso_identity__issuer=claims["iss"], sso_identity__subject=claims["sub"])

    def create_user(self, claims: dict[str, Any]) -> Any:
        with transaction.atomic():
            user = get_user_model().objects.create_user(
                username=self._free_username(claims), email=claims.get("email", "")
            )
            user.set_unusable_password()  # signs in through the provider only
            user.save(update_fields=["password"])
            SsoIdentity.objects.create(user=user, issuer=claims["iss"], subject=claims["sub"])
            self._sync_memberships(user, claims)
        return user

    def update_user(self, user: Any, claims: dict[str, Any]) -> Any:
        if not user.is_active:
            raise SuspiciousOperation(f"{user.get_username()} is deactivated here")
        with transaction.atomic():
            if claims.get("email") and claims["email"] != user.email:
                user.email = claims["email"]
                user.save(update_fields=["email"])
            self._sync_memberships(user, claims)
        return user

    @staticmethod
    def _free_username(claims: dict[str, Any]) -> str:
        """The provider's preferred username unless a local account holds it
        (never take it over): then with a suffix from the subject."""
        wanted = str(claims.get("preferred_username") or claims.get("email") or "sso")[:100]
        if not get_user_model().objects.filter(username=wanted).exists():
            return wanted
        digest = hashlib.sha256(f"{claims['iss']} {claims['sub']}".encode()).hexdigest()[:10]
        return f"{wanted}-sso-{digest}"

    @staticmethod
    def _sync_memberships(user: Any, claims: dict[str, Any]) -> None:
        granted = roles_from_claims(claims)
        tenants = dict(Tenant.objects.filter(slug__in=granted).values_list("slug", "pk"))
        for slug in sorted(set(granted) - set(tenants)):
            log.warning("single sign-on: OIDC_GROUP_ROLES names tenant %r, which does not exist", slug)
        wanted = {tenants[slug]: role for slug, role in granted.items() if slug in tenants}
        # The identity provider's claims make these changes: recorded as its.
        with acting_as(Actor.system(f"single sign-on {claims['iss']}"[:255])):
            Membership.objects.filter(user=user).exclude(tenant_id__in=wanted).delete()
            for tenant_id, role in wanted.items():
                Membership.objects.update_or_create(user=user, tenant_id=tenant_id, defaults={"role": role})
