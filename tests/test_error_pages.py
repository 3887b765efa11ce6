"""The log-in page and the error pages, in the app's look.

The 500 page must render when the thing that failed is the database, the
session or the static files' manifest: it is rendered without a request
context and reads nothing from the database.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse
from django.test import Client, RequestFactory
from django.urls import path, reverse

from ledgerdash import urls as project_urls
from ledgerdash.ops import errorpages as errors
from tests.conftest import as_user


def boom(request: HttpRequest) -> HttpResponse:
    raise RuntimeError("the database went away")


# This module is the URLconf of the tests below that need a failing view:
# the project's URLs and error handlers, plus one view that raises.
urlpatterns = [path("boom/", boom), *project_urls.urlpatterns]
handler500 = project_urls.handler500


def test_the_500_page_renders_without_the_database() -> None:
    # No django_db mark: any query here raises (pytest-django blocks it).
    response = errors.server_error(RequestFactory().get("/attempts/7/"))
    page = response.content.decode()
    assert response.status_code == 500
    assert '<h1 id="error-h">Something went wrong</h1>' in page
    assert '<link rel="stylesheet" href="/static/ledgerdash/app.css">' in page
    assert 'class="brand"' in page


@pytest.mark.urls(__name__)
def test_a_failing_view_answers_the_styled_500_page(django_db_blocker: Any) -> None:
    client = Client(raise_request_exception=False)
    with django_db_blocker.block():  # the failure is the database: the page must not need it
        response = client.get("/boom/")
    assert response.status_code == 500
    assert "Something went wrong" in response.content.decode()
    assert "the database went away" not in response.content.decode()  # nothing about the failure leaks


def test_the_500_page_goes_without_its_stylesheet_when_the_manifest_lacks_it(settings: Any, tmp_path: Any) -> None:
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.ManifestStaticFilesStorage"},
    }
    settings.STATIC_ROOT = tmp_path  # no manifest: static() raises
    response = errors.server_error(RequestFactory().get("/"))
    assert response.status_code == 500
    page = response.content.decode()
    assert "Something went wrong" in page
    assert "stylesheet" not in page


def test_the_500_page_falls_back_to_a_fixed_page_when_its_template_fails() -> None:
    response = errors.server_error(RequestFactory().get("/"), template_name="no-such-template.html")
    assert response.status_code == 500
    assert response.content.decode() == errors.FALLBACK


def test_the_404_page_is_in_the_apps_look(operator_a: Any) -> None:
    response = as_user(operator_a).get("/attempts/999999/")
    page = response.content.decode()
    assert response.status_code == 404
    assert '<p class="error-code">404</p>' in page
    assert 'aria-label="Main"' in page  # the navigation of every page
    assert "nothing you can see" in page


def test_the_403_page_says_why_in_the_apps_look(viewer_a: Any, tenant_a: Any) -> None:
    from ledgerdash.ledger.models import State
    from tests.factories import attempt_in

    attempt = attempt_in(State.UNKNOWN, tenant_a, key="not-yours-to-claim")
    response = as_user(viewer_a).post(reverse("reviews:claim", args=[attempt.pk]))
    page = response.content.decode()
    assert response.status_code == 403
    assert '<p class="error-code">403</p>' in page
    assert '<bdi class="u wraps">viewer-a is a viewer of acme and needs to be an operator</bdi>' in page


def test_the_csrf_failure_page_says_what_to_do(operator_a: Any) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator_a)
    response = client.post(reverse("reviews:bulk_assign"), {})
    assert response.status_code == 403
    assert "This form has expired" in response.content.decode()


def test_the_400_page_needs_no_session(client: Client) -> None:
    response = client.get("/", headers={"host": "evil.example"})
    assert response.status_code == 400
    page = response.content.decode()
    assert "Bad request" in page
    assert "app.css" in page


@pytest.mark.django_db
def test_the_login_page_is_styled_and_says_what_went_wrong(client: Client, operator_a: Any) -> None:
    page = client.get(reverse("login") + "?next=/queues/unknown/").content.decode()
    assert 'class="login-card"' in page
    assert "Log in to open that page." in page
    assert '<label for="id_username">Username</label>' in page
    refused = client.post(reverse("login"), {"username": "operator-a", "password": "wrong"}).content.decode()
    assert 'class="login-error" role="alert"' in refused
    assert "Please enter a correct username and password." in refused
    response = client.post(reverse("login"), {"username": "operator-a", "password": "pw-operator-a"})
    assert response.status_code == 302
