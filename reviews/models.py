"""How people sign in: the identity provider's name for a person (memberships
and roles live in the ledger, :mod:`ledgerdash.ledger.tenancy`)."""

from __future__ import annotations

from django.conf import settings
from django.db import models


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
