"""Who may see and decide what: membership of a user in a tenant, with a role."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from ledgerdash.ledger.models import Tenant


class Role(models.TextChoices):
    VIEWER = "viewer", "viewer"
    OPERATOR = "operator", "operator"
    APPROVER = "approver", "approver"
    ADMIN = "admin", "admin"


#: Each role can do what the roles before it can.
ROLE_RANK = {Role.VIEWER: 0, Role.OPERATOR: 1, Role.APPROVER: 2, Role.ADMIN: 3}


def roles_at_least(role: Role | str) -> list[Role]:
    """``role`` and every role above it."""
    return [r for r in Role if ROLE_RANK[r] >= ROLE_RANK[Role(role)]]


class Membership(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tenant", "user"]
        constraints = [
            models.UniqueConstraint(fields=["user", "tenant"], name="reviews_membership_unique"),
            models.CheckConstraint(condition=models.Q(role__in=Role.values), name="reviews_membership_role_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.user} {self.role} of {self.tenant}"

    def can(self, role: Role | str) -> bool:
        return ROLE_RANK[Role(self.role)] >= ROLE_RANK[Role(role)]


class SsoIdentity(models.Model):
    """The identity provider's name for a person: the ID token's issuer and subject.

    Single sign-on finds people by this pair only (reviews/sso.py), never by
    e-mail or username, so no claim a person may edit at the provider can
    sign them in as someone else here."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="sso_identity")
    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["issuer", "subject"], name="reviews_ssoidentity_unique")]

    def __str__(self) -> str:
        return f"{self.user} = {self.subject} at {self.issuer}"
