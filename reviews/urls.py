from __future__ import annotations

from django.urls import path

from reviews import views

app_name = "reviews"

urlpatterns = [
    path("", views.home, name="home"),
]
