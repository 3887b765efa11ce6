"""Who is calling: one bearer token per agent (:mod:`ledgerdash.ledger.tokens`)."""

from __future__ import annotations

from django.http import HttpRequest
from ninja.security import HttpBearer

from ledgerdash.ledger import recording
from ledgerdash.ledger.api.errors import MISSING_TOKEN, ApiError
from ledgerdash.ledger.errors import InsufficientScope
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import ApiToken, TokenScope
from ledgerdash.ledger.tokens import token_authenticate_cached, token_touch

READ = TokenScope.READ.value
WRITE = TokenScope.WRITE.value
DECIDE = TokenScope.DECIDE.value
AGENT_HEADER = "Ledgerdash-Agent"
#: Where WSGI puts those headers: read there, as ``request.headers`` would build a
#: mapping of every header on first use (some 10 us of each API request).
AUTHORIZATION_META = "HTTP_AUTHORIZATION"
AGENT_META = "HTTP_" + AGENT_HEADER.upper().replace("-", "_")


class BearerToken(HttpBearer):
    """``Authorization: Bearer <token>``, and nothing else: a session cookie
    never authenticates an API request (so CSRF cannot apply to one)."""

    def __init__(self, scope: str) -> None:
        super().__init__()
        self.scope = scope

    def __call__(self, request: HttpRequest) -> ApiToken:
        scheme, _, credentials = request.META.get(AUTHORIZATION_META, "").partition(" ")
        if scheme.lower() != "bearer" or not credentials.strip():
            raise ApiError("missing_token", MISSING_TOKEN)
        return self.authenticate(request, credentials.strip())

    def authenticate(self, request: HttpRequest, token: str) -> ApiToken:
        found = token_authenticate_cached(token)
        if self.scope not in found.scope_set:
            raise InsufficientScope(
                InsufficientScope.MESSAGE.format(prefix=found.prefix, scope=self.scope, scopes=found.scopes)
            )
        recording.resolve_tenant(found.tenant)  # refuses an inactive tenant
        token_touch(found)
        return found


def token_of(request: HttpRequest) -> ApiToken:
    token = getattr(request, "auth", None)
    assert isinstance(token, ApiToken), "every operation is authenticated"
    return token


def actor_of(request: HttpRequest) -> Actor:
    """The agent named in the events: its own label (if it sends one) and the token."""
    label = "".join(c for c in request.META.get(AGENT_META, "") if c.isprintable()).strip()[:100]
    return Actor.agent(f"{label or 'api'} via token {token_of(request).prefix}")
