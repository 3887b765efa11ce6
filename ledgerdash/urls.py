from __future__ import annotations

from django.conf import settings
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from ledgerdash.ledger import api

urlpatterns = [
    path("login/", auth_views.LoginView.as_view(extra_context={"sso": settings.OIDC_ENABLED}), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls()),
    path("", include("reviews.urls")),
]

# The 500 page renders without the database, a session or URL reversing (reviews/errors.py).
handler500 = "reviews.errors.server_error"
if settings.OIDC_ENABLED:
    urlpatterns.insert(0, path("oidc/", include("mozilla_django_oidc.urls")))
