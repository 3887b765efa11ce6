from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from ledgerdash.ledger import api

urlpatterns = [
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls()),
    path("", include("reviews.urls")),
]

# The 500 page renders without the database, a session or URL reversing (reviews/errors.py).
handler500 = "reviews.errors.server_error"
