"""Per-tenant provider credentials: a tenant binds a tool's header
placeholder to a secret by name; the secret lives in the secrets file or
the environment, never in the database, an event, a page or an export; the
HTTP adapter sends the calling tenant's secret; binding changes are events
in that tenant's chain."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client

from ledgerdash.ledger import audit, reconciler, recording
from ledgerdash.ledger.errors import NothingHappened
from ledgerdash.ledger.events import EventKind
from ledgerdash.ledger.models import Attempt, AttemptEvent, State, Tenant, Tool, ToolCredential
from ledgerdash.ledger.providers import registry
from ledgerdash.ledger.providers.base import LookupStatus
from tests.conftest import AGENT, as_user, record

ACME_SECRET = "acme-s3cret-7f3a91c2"
GLOBEX_SECRET = "globex-s3cret-0b8e44d1"
SHARED_SECRET = "shared-s3cret-5d21aa90"


class Provider:
    """A real HTTP provider on a local port that records what each request carried."""

    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                provider.seen.append({"method": "POST", "authorization": self.headers.get("Authorization", "")})
                self._answer(201, {"id": f"req-{len(provider.seen)}"})

            def do_GET(self) -> None:
                provider.seen.append({"method": "GET", "authorization": self.headers.get("Authorization", "")})
                self._answer(404, {"error": "no such key"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def authorizations(self) -> list[str]:
        return [seen["authorization"] for seen in self.seen]


@pytest.fixture
def provider() -> Iterator[Provider]:
    running = Provider()
    running.thread.start()
    yield running
    running.server.shutdown()
    running.server.server_close()


@pytest.fixture
def secrets_file(tmp_path: Path, settings: Any) -> Path:
    path = tmp_path / "secrets.json"
    path.write_text(json.dumps({"ACME_MAIL": ACME_SECRET, "GLOBEX_MAIL": GLOBEX_SECRET}), encoding="utf-8")
    settings.LEDGERDASH_SECRETS_FILE = str(path)
    return path


@pytest.fixture
def mail_tool(provider: Provider, tenant_a: Tenant, tenant_b: Tenant) -> Tool:
    return Tool.objects.create(
        name="send_email",
        idempotent=True,
        config={
            "dispatch_url": f"{provider.url}/v1/messages",
            "lookup_url": f"{provider.url}/v1/messages?key={{key}}",
            "headers": {"Authorization": "Bearer ${MAIL_TOKEN}"},
        },
    )


@pytest.fixture
def root_client(make_user: Any) -> Client:
    client = Client()
    client.force_login(make_user("root", is_staff=True, is_superuser=True))
    return client


def head(tenant: Tenant) -> int:
    return AttemptEvent.objects.filter(tenant=tenant).count()


def new_events(tenant: Tenant, since: int) -> list[AttemptEvent]:
    return list(AttemptEvent.objects.filter(tenant=tenant, seq__gt=since).order_by("seq"))


def bind(tenant: Tenant, tool: Tool, secret_name: str) -> ToolCredential:
    return ToolCredential.objects.create(tenant=tenant, tool=tool, placeholder="MAIL_TOKEN", secret_name=secret_name)


# --- the provider sends the calling tenant's credential -----------------------------------------


def test_each_tenant_calls_with_its_own_credential(
    provider: Provider, mail_tool: Tool, tenant_a: Tenant, tenant_b: Tenant, secrets_file: Path
) -> None:
    bind(tenant_a, mail_tool, "ACME_MAIL")
    bind(tenant_b, mail_tool, "GLOBEX_MAIL")
    for tenant in (tenant_a, tenant_b):
        profile = registry.profile_for("send_email", tenant.pk)
        assert profile is not None
        sent = profile.adapter.dispatch(key=f"k-{tenant.slug}", args={"to": "x@example.com"})
        assert sent.request_id
        assert profile.adapter.lookup(key=f"k-{tenant.slug}", args_hash="0" * 64).status == LookupStatus.NOT_FOUND
    assert provider.authorizations() == [f"Bearer {ACME_SECRET}"] * 2 + [f"Bearer {GLOBEX_SECRET}"] * 2


def test_an_agent_and_the_reconciler_use_the_tenants_credential(
    provider: Provider, mail_tool: Tool, tenant_a: Tenant, tenant_b: Tenant, secrets_file: Path
) -> None:
    bind(tenant_a, mail_tool, "ACME_MAIL")
    bind(tenant_b, mail_tool, "GLOBEX_MAIL")
    send = recording.provider_tool("send_email", key="welcome:{user}")
    with recording.task(tenant="globex", task_id="t"):
        send(user="u1", to="new@example.com")
    assert provider.authorizations() == [f"Bearer {GLOBEX_SECRET}"]

    # An attempt of acme's left UNKNOWN: the reconciler looks it up with acme's secret.
    attempt = recording.mark_unknown(
        recording.mark_dispatched(record(tenant_a, "lost-1"), actor=AGENT), reason="timeout", actor=AGENT
    )
    Attempt.objects.filter(pk=attempt.pk).update(next_check_at=attempt.created_at, lands_by=attempt.created_at)
    reconciler.Reconciler().run_pass()
    assert provider.authorizations()[1] == f"Bearer {ACME_SECRET}"
    assert set(provider.authorizations()) == {f"Bearer {GLOBEX_SECRET}", f"Bearer {ACME_SECRET}"}


def test_a_tenant_without_a_binding_never_borrows_another_tenants_credential(
    provider: Provider, mail_tool: Tool, tenant_a: Tenant, tenant_b: Tenant, secrets_file: Path, monkeypatch: Any
) -> None:
    monkeypatch.setenv("MAIL_TOKEN", SHARED_SECRET)
    bind(tenant_a, mail_tool, "ACME_MAIL")
    profile = registry.profile_for("send_email", tenant_b.pk)
    assert profile is not None
    refusal = r"per-tenant credential of send_email, and none is bound for tenant globex"
    with pytest.raises(NothingHappened, match=refusal):
        profile.adapter.dispatch(key="k", args={})
    assert profile.adapter.lookup(key="k", args_hash="0" * 64).status == LookupStatus.UNAVAILABLE
    assert provider.seen == []


def test_without_bindings_a_tool_uses_its_shared_secret(
    provider: Provider, mail_tool: Tool, tenant_a: Tenant, monkeypatch: Any
) -> None:
    monkeypatch.setenv("MAIL_TOKEN", SHARED_SECRET)
    profile = registry.profile_for("send_email", tenant_a.pk)
    assert profile is not None
    profile.adapter.dispatch(key="k", args={})
    assert provider.authorizations() == [f"Bearer {SHARED_SECRET}"]


def test_a_missing_or_rotated_secret(provider: Provider, mail_tool: Tool, tenant_a: Tenant, secrets_file: Path) -> None:
    bind(tenant_a, mail_tool, "ACME_NEXT")
    profile = registry.profile_for("send_email", tenant_a.pk)
    assert profile is not None
    with pytest.raises(NothingHappened, match="needs secret ACME_NEXT") as refused:
        profile.adapter.dispatch(key="k", args={})
    assert ACME_SECRET not in str(refused.value)
    assert provider.seen == []

    secrets_file.write_text(json.dumps({"ACME_NEXT": "rotated-value-1"}), encoding="utf-8")
    profile.adapter.dispatch(key="k", args={})
    assert provider.authorizations() == ["Bearer rotated-value-1"]


def test_a_secrets_file_that_is_not_json_says_so_without_quoting_it(
    provider: Provider, mail_tool: Tool, tenant_a: Tenant, secrets_file: Path
) -> None:
    bind(tenant_a, mail_tool, "ACME_MAIL")
    secrets_file.write_text('{"ACME_MAIL": "' + ACME_SECRET, encoding="utf-8")
    profile = registry.profile_for("send_email", tenant_a.pk)
    assert profile is not None
    with pytest.raises(NothingHappened, match="not valid JSON") as refused:
        profile.adapter.dispatch(key="k", args={})
    assert ACME_SECRET not in str(refused.value)


# --- binding changes are events in the tenant's chain, and no secret is ever shown ---------------


def test_binding_changing_and_removing_a_credential_in_the_admin(
    root_client: Client, mail_tool: Tool, tenant_a: Tenant, tenant_b: Tenant, secrets_file: Path
) -> None:
    since_a, since_b = head(tenant_a), head(tenant_b)
    form = {"tenant": tenant_a.pk, "tool": mail_tool.pk, "placeholder": "MAIL_TOKEN", "secret_name": "ACME_MAIL"}
    response = root_client.post("/admin/ledger/toolcredential/add/", form)
    assert response.status_code == 302, response.content.decode()[:2000]
    binding = ToolCredential.objects.get()
    (bound,) = new_events(tenant_a, since_a)
    assert (bound.kind, bound.actor_label, bound.details["change"]) == (EventKind.CREDENTIAL, "root", "created")
    assert bound.details["after"] == {
        "tenant": "acme",
        "tool": "send_email",
        "placeholder": "MAIL_TOKEN",
        "secret_name": "ACME_MAIL",
    }

    since_a = head(tenant_a)
    response = root_client.post(
        f"/admin/ledger/toolcredential/{binding.pk}/change/", {**form, "secret_name": "ACME_MAIL_2"}
    )
    assert response.status_code == 302
    (changed,) = new_events(tenant_a, since_a)
    assert (changed.details["before"], changed.details["after"]) == (
        {"secret_name": "ACME_MAIL"},
        {"secret_name": "ACME_MAIL_2"},
    )

    since_a = head(tenant_a)
    assert root_client.post(f"/admin/ledger/toolcredential/{binding.pk}/delete/", {"post": "yes"}).status_code == 302
    (removed,) = new_events(tenant_a, since_a)
    assert removed.details["change"] == "deleted"
    assert new_events(tenant_b, since_b) == []
    for tenant in (tenant_a, tenant_b):
        assert audit.verify_tenant(tenant).ok


def test_the_admin_refuses_a_placeholder_the_tool_does_not_use(
    root_client: Client, mail_tool: Tool, tenant_a: Tenant
) -> None:
    since = head(tenant_a)
    form = {"tenant": tenant_a.pk, "tool": mail_tool.pk, "placeholder": "API_KEY", "secret_name": "ACME_MAIL"}
    response = root_client.post("/admin/ledger/toolcredential/add/", form)
    assert response.status_code == 200
    assert "uses no ${API_KEY} in its headers (it uses MAIL_TOKEN)" in response.content.decode()
    bad = {**form, "placeholder": "MAIL_TOKEN", "secret_name": "not a name"}
    page = root_client.post("/admin/ledger/toolcredential/add/", bad)
    assert "letters, digits and underscores" in page.content.decode()
    assert not ToolCredential.objects.exists()
    assert new_events(tenant_a, since) == []


def test_removing_a_tool_records_the_bindings_it_takes_with_it(
    mail_tool: Tool, tenant_a: Tenant, tenant_b: Tenant
) -> None:
    bind(tenant_a, mail_tool, "ACME_MAIL")
    since_a, since_b = head(tenant_a), head(tenant_b)
    mail_tool.delete()
    assert [(e.kind, e.details["change"]) for e in new_events(tenant_a, since_a)] == [
        ("credential", "deleted"),
        ("tool", "deleted"),
    ]
    assert [(e.kind, e.details["change"]) for e in new_events(tenant_b, since_b)] == [("tool", "deleted")]


def test_no_secret_appears_in_events_pages_or_exports(
    root_client: Client,
    admin_a: Any,
    mail_tool: Tool,
    tenant_a: Tenant,
    provider: Provider,
    secrets_file: Path,
    tmp_path: Path,
) -> None:
    binding = bind(tenant_a, mail_tool, "ACME_MAIL")
    binding.secret_name = "GLOBEX_MAIL"
    binding.save()
    profile = registry.profile_for("send_email", tenant_a.pk)
    assert profile is not None
    profile.adapter.dispatch(key="k", args={})
    assert provider.authorizations() == [f"Bearer {GLOBEX_SECRET}"]

    events = list(AttemptEvent.objects.filter(tenant=tenant_a).values_list("reason", "details"))
    texts = [json.dumps(events)]
    settings_page = as_user(admin_a).get(f"/tenants/{tenant_a.slug}/settings/")
    assert settings_page.status_code == 200
    texts.append(settings_page.content.decode())
    assert "ACME_MAIL" in texts[-1]  # the names are shown
    assert "GLOBEX_MAIL" in texts[-1]
    for url in (
        "/admin/ledger/toolcredential/",
        f"/admin/ledger/toolcredential/{binding.pk}/change/",
        f"/admin/ledger/tool/{mail_tool.pk}/change/",
        "/admin/ledger/attemptevent/",
    ):
        page = root_client.get(url)
        assert page.status_code == 200, url
        texts.append(page.content.decode())
    for fmt in ("csv", "ndjson"):
        out = tmp_path / f"export.{fmt}"
        call_command("export_audit", "--tenant", "acme", "--format", fmt, "--out", str(out))
        texts.append(out.read_text(encoding="utf-8"))
        assert "credential binding send_email ${MAIL_TOKEN} in acme" in texts[-1]
    for text in texts:
        assert ACME_SECRET not in text
        assert GLOBEX_SECRET not in text


def test_an_attempt_still_settles_after_the_tenants_binding_moved(
    provider: Provider, mail_tool: Tool, tenant_a: Tenant, secrets_file: Path
) -> None:
    binding = bind(tenant_a, mail_tool, "ACME_MAIL")
    send = recording.provider_tool("send_email", key="order:{n}")
    with recording.task(tenant="acme", task_id="t"):
        send(n=1)
    ToolCredential.objects.filter(pk=binding.pk).update(secret_name="GLOBEX_MAIL")
    with recording.task(tenant="acme", task_id="t"):
        send(n=2)
    assert provider.authorizations() == [f"Bearer {ACME_SECRET}", f"Bearer {GLOBEX_SECRET}"]
    assert Attempt.objects.filter(tenant=tenant_a, state=State.OUTCOME_CONFIRMED).count() == 2
    (event,) = AttemptEvent.objects.filter(tenant=tenant_a, kind="credential", details__change="changed")
    assert event.details["after"] == {"secret_name": "GLOBEX_MAIL"}
