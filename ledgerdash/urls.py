from __future__ import annotations

from django.conf import settings
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from ledgerdash.ledger import api
from ledgerdash.middleware import API_ROOT
from ledgerdash.ops import health, metrics

urlpatterns = [
    # First: every agent's request is resolved here, and patterns are tried in order.
    path(API_ROOT.removeprefix("/"), api.urls()),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", metrics.metrics, name="metrics"),
    path("login/", auth_views.LoginView.as_view(extra_context={"sso": settings.OIDC_ENABLED}), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("", include("reviews.urls")),
]

# The 500 page renders without the database, a session or URL reversing (ledgerdash/ops/errorpages.py);
# a database that is down or too slow answers 503 instead (ledgerdash/ops/unavailable.py).
handler500 = "ledgerdash.ops.unavailable.server_error"
if settings.OIDC_ENABLED:
    urlpatterns.insert(0, path("oidc/", include("mozilla_django_oidc.urls")))
