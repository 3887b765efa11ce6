"""Configuration as code: ``manage.py ledger_config`` plans, applies and
exports tenants, policies, tools, people, credential bindings and
notifications from one TOML file. A plan writes nothing; an apply makes
exactly the planned changes, each an event in the tenant's chain; applying
again changes nothing; bad input names where it is and writes nothing;
nothing in the database is ever deleted."""

from __future__ import annotations

import io
import tomllib
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from ledgerdash.ledger import audit, config, recording
from ledgerdash.ledger.events import Actor, EventKind
from ledgerdash.ledger.models import (
    AttemptEvent,
    Membership,
    OnCallShift,
    Policy,
    State,
    Tenant,
    Tool,
    ToolCredential,
)
from ledgerdash.ledger.policies import policy_publish
from ledgerdash.ledger.tokens import token_create
from ledgerdash.notify.models import Channel, Rule
from tests.api_support import Api

EXAMPLE = Path(__file__).resolve().parent.parent / "deploy" / "ledger.example.toml"
ACTOR_LABEL = "manage.py ledger_config"

TOOL = """
[tools."mail.send"]
adapter = "http"
idempotent = true
key_retention_seconds = 3600
max_request_seconds = 10.0
dispatch_lease_seconds = 30.0
max_checks = 4

[tools."mail.send".config]
dispatch_url = "https://mail.example.com/v1/messages"
lookup_url = "https://mail.example.com/v1/messages?key={key}"
headers = { Authorization = "Bearer ${MAIL_TOKEN}" }
"""

TENANT = """
[tenants.initech]
name = "Initech"
sla_minutes = 90
default_owner = "peter"

[tenants.initech.policy.tools]
"mail.send" = ["mail:send"]

[tenants.initech.policy.approvals]
"mail.send" = "length(to) > `10`"

[tenants.initech.members]
peter = "operator"
joanna = "approver"

[[tenants.initech.credentials]]
tool = "mail.send"
placeholder = "MAIL_TOKEN"
secret_name = "INITECH_MAIL_TOKEN"

[[tenants.initech.on_call]]
user = "peter"
starts_at = 2099-01-01T08:00:00Z
ends_at = 2099-01-01T16:00:00Z

[[tenants.initech.channels]]
name = "ops"
kind = "webhook"
target = "https://hooks.example.com/ledgerdash"

[[tenants.initech.rules]]
event = "entered_manual_review"
channel = "ops"
sla_minutes = 45
"""

FULL = TOOL + TENANT


def write(tmp_path: Path, text: str, name: str = "ledger.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("ledger_config", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def written() -> dict[str, int]:
    """How many rows of everything the file can describe (and of events) there are."""
    models: list[Any] = [
        Tenant,
        Tool,
        Policy,
        Membership,
        OnCallShift,
        ToolCredential,
        Channel,
        Rule,
        AttemptEvent,
        get_user_model(),
    ]
    return {model.__name__: model._default_manager.count() for model in models}


def events_of(slug: str, since: int = 0) -> list[AttemptEvent]:
    return list(AttemptEvent.objects.filter(tenant__slug=slug, seq__gt=since).order_by("seq"))


def head(slug: str) -> int:
    return AttemptEvent.objects.filter(tenant__slug=slug).count()


# --- plan -------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_plan_lists_what_would_be_created_and_writes_nothing(tmp_path: Path) -> None:
    before = written()
    out = run("plan", write(tmp_path, FULL))
    assert written() == before
    assert "create    tenant initech" in out
    assert "create    tool mail.send" in out
    assert "publish   policy of initech v1: allow mail.send mail:send" in out
    assert "create    user peter: no usable password" in out
    assert "create    credential binding mail.send ${MAIL_TOKEN} in initech" in out
    assert out.strip().endswith("to publish")


# --- apply ------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_apply_creates_everything_the_file_describes_each_an_event_of_the_tenant(tmp_path: Path) -> None:
    out = run("apply", write(tmp_path, FULL))
    assert "applied" in out

    tenant = Tenant.objects.get(slug="initech")
    assert (tenant.name, tenant.is_active, tenant.sla_minutes) == ("Initech", True, 90)
    assert tenant.default_owner is not None
    assert tenant.default_owner.get_username() == "peter"
    assert not tenant.default_owner.has_usable_password()
    policy = Policy.objects.get(tenant=tenant)
    assert (policy.version, policy.tools, policy.approvals) == (
        1,
        {"mail.send": ["mail:send"]},
        {"mail.send": "length(to) > `10`"},
    )
    tool = Tool.objects.get(name="mail.send")
    assert (tool.idempotent, tool.max_checks, tool.max_request_seconds, tool.max_dispatches) == (True, 4, 10.0, 3)
    assert dict(Membership.objects.filter(tenant=tenant).values_list("user__username", "role")) == {
        "peter": "operator",
        "joanna": "approver",
    }
    assert ToolCredential.objects.get(tenant=tenant).secret_name == "INITECH_MAIL_TOKEN"
    assert OnCallShift.objects.get(tenant=tenant).user.get_username() == "peter"
    channel = Channel.objects.get(tenant=tenant)
    assert (channel.name, channel.kind) == ("ops", "webhook")
    assert f"signing secret {channel.secret}" in out  # shown once, as the dashboard does
    assert Rule.objects.get(tenant=tenant).sla_minutes == 45

    events = events_of("initech")
    assert [e.kind for e in events] == [
        EventKind.TENANT,
        EventKind.POLICY,
        EventKind.TOOL,  # after the policy allows it, so it is in this chain
        EventKind.CREDENTIAL,
        EventKind.MEMBERSHIP,
        EventKind.MEMBERSHIP,
        EventKind.ON_CALL,
        EventKind.NOTIFY_CHANNEL,
        EventKind.NOTIFY_RULE,
    ]
    assert {(e.actor_kind, e.actor_label) for e in events} == {("system", ACTOR_LABEL)}
    assert channel.secret not in str([e.details for e in events])
    assert audit.verify_tenant(tenant).ok


@pytest.mark.django_db
def test_applying_the_same_file_twice_changes_nothing(tmp_path: Path) -> None:
    path = write(tmp_path, FULL)
    run("apply", path)
    before = written()

    plan = run("plan", path)
    again = run("apply", path)

    assert written() == before
    assert plan.strip().endswith("no changes")
    assert not [line for line in plan.splitlines() if line.startswith(("create", "change", "publish"))]
    assert "nothing to apply" in again


@pytest.mark.django_db
def test_a_changed_field_is_planned_and_applied_as_one_event_naming_it(tmp_path: Path) -> None:
    run("apply", write(tmp_path, FULL))
    since = head("initech")
    changed = write(tmp_path, FULL.replace("max_checks = 4", "max_checks = 6"), "changed.toml")

    plan = run("plan", changed)
    assert "change    tool mail.send: max_checks from 4 to 6" in plan
    assert plan.strip().endswith("1 change: 1 to change")
    assert head("initech") == since

    run("apply", changed)
    (event,) = events_of("initech", since)
    assert (event.kind, event.details["change"], event.details["changed"]) == ("tool", "changed", ["max_checks"])
    assert (event.details["before"], event.details["after"]) == ({"max_checks": 4}, {"max_checks": 6})
    assert event.actor_label == ACTOR_LABEL
    assert Tool.objects.get(name="mail.send").max_checks == 6


@pytest.mark.django_db
def test_a_header_change_shows_the_secret_names_it_references_never_values(tmp_path: Path) -> None:
    run("apply", write(tmp_path, FULL))
    changed = FULL.replace("Bearer ${MAIL_TOKEN}", "Token ${MAIL_TOKEN}")
    plan = run("plan", write(tmp_path, changed, "changed.toml"))
    assert "config.headers.Authorization changed (not shown)" in plan
    assert "Token" not in plan


@pytest.mark.django_db
def test_a_policy_is_published_again_only_when_its_tools_or_approvals_differ(tmp_path: Path) -> None:
    run("apply", write(tmp_path, FULL))
    reordered = FULL.replace('["mail:send"]', '["mail:send", "mail:read"]')
    run("apply", write(tmp_path, reordered, "wider.toml"))
    assert list(Policy.objects.filter(tenant__slug="initech").values_list("version", flat=True)) == [2, 1]

    same_scopes_other_order = FULL.replace('["mail:send"]', '["mail:read", "mail:send"]')
    plan = run("plan", write(tmp_path, same_scopes_other_order, "same.toml"))
    assert "unchanged policy of initech v2" in plan
    assert plan.strip().endswith("no changes")


@pytest.mark.django_db
def test_a_role_and_a_tenant_change_are_each_one_event(tmp_path: Path) -> None:
    run("apply", write(tmp_path, FULL))
    since = head("initech")
    changed = FULL.replace('joanna = "approver"', 'joanna = "admin"').replace('name = "Initech"', 'name = "Initrode"')
    plan = run("plan", write(tmp_path, changed, "changed.toml"))
    assert 'change    tenant initech: name from "Initech" to "Initrode"' in plan
    assert 'change    membership joanna in initech: role from "approver" to "admin"' in plan

    run("apply", write(tmp_path, changed, "changed.toml"))
    events = events_of("initech", since)
    assert [(e.kind, e.details["changed"]) for e in events] == [("tenant", ["name"]), ("membership", ["role"])]


@pytest.mark.django_db
def test_what_the_database_has_and_the_file_does_not_is_kept_and_said(tmp_path: Path, make_user: Any) -> None:
    run("apply", write(tmp_path, FULL))
    tenant = Tenant.objects.get(slug="initech")
    Membership.objects.create(user=make_user("bob"), tenant=tenant, role="viewer")
    Tenant.objects.create(slug="umbrella", name="Umbrella")
    before = written()

    plan = run("apply", write(tmp_path, FULL))

    assert written() == before
    assert "not in the file: kept (never deleted):" in plan
    assert "  membership bob in initech (viewer)" in plan
    assert "  tenant umbrella" in plan
    assert plan.strip().endswith("nothing to apply")


# --- bad input --------------------------------------------------------------------------------

BAD = [
    pytest.param(FULL + "\n[tenants.initech.extra]\nx = 1\n", "tenants.initech.extra: unknown key", id="unknown-key"),
    pytest.param(
        FULL.replace("max_checks = 4", 'max_checks = "4"'),
        'tools."mail.send".max_checks: must be an integer',
        id="wrong-type",
    ),
    pytest.param(
        FULL.replace('"mail.send" = ["mail:send"]', '"mail.send" = ["mail:send"]\n"mail.sned" = ["mail:send"]'),
        'tenants.initech.policy.tools."mail.sned": no such tool',
        id="unknown-tool-in-policy",
    ),
    pytest.param(
        FULL.replace("length(to) > `10`", "length(to) >"),
        "tenants.initech.policy.approvals.\"mail.send\": the approval condition of 'mail.send' is not valid JMESPath",
        id="invalid-jmespath",
    ),
    pytest.param(
        FULL.replace('joanna = "approver"', 'joanna = "boss"'),
        "tenants.initech.members.joanna: unknown role 'boss' (one of viewer, operator, approver, admin)",
        id="unknown-role",
    ),
    pytest.param(
        FULL.replace("max_request_seconds = 10.0", "max_request_seconds = -3"),
        'tools."mail.send".max_request_seconds: must be above 0, not -3',
        id="request-time-negative",
    ),
    pytest.param(
        FULL.replace("max_checks = 4", "max_checks = 4\nbackoff_base_seconds = 0"),
        'tools."mail.send".backoff_base_seconds: must be above 0, not 0',
        id="back-off-zero",
    ),
    pytest.param(
        FULL.replace("max_checks = 4", "max_checks = 4\nmax_dispatches = 0"),
        'tools."mail.send".max_dispatches: must be 1 or more, not 0',
        id="no-dispatch",
    ),
    pytest.param(
        FULL.replace("max_checks = 4", "max_checks = 4\nlookup_lag_seconds = -1.5"),
        'tools."mail.send".lookup_lag_seconds: must not be negative',
        id="lag-negative",
    ),
    pytest.param(
        FULL.replace("dispatch_lease_seconds = 30.0", "dispatch_lease_seconds = 5.0"),
        'tools."mail.send".dispatch_lease_seconds: the dispatch lease (5s) must exceed the maximum request time',
        id="tool-clean",
    ),
    pytest.param(
        FULL.replace('placeholder = "MAIL_TOKEN"', 'placeholder = "SMTP_TOKEN"'),
        "tenants.initech.credentials[0].placeholder: tool mail.send uses no ${SMTP_TOKEN} in its headers",
        id="credential-placeholder",
    ),
    pytest.param(
        FULL.replace("starts_at = 2099-01-01T08:00:00Z", "starts_at = 2099-01-01T08:00:00"),
        "tenants.initech.on_call[0].starts_at: needs an offset",
        id="shift-without-offset",
    ),
    pytest.param(
        FULL.replace('channel = "ops"', 'channel = "opps"'),
        "tenants.initech.rules[0].channel: no channel 'opps' in initech",
        id="rule-unknown-channel",
    ),
    pytest.param(
        FULL.replace("[tenants.initech.members]", "[tenants.initech.members"), "not valid TOML", id="not-toml"
    ),
    pytest.param(
        FULL.replace('"mail.send" = ["mail:send"]', '"mail.send" = [3]'),
        'tenants.initech.policy.tools."mail.send"[0]: must be a string, not an integer',
        id="scope-not-a-string",
    ),
    pytest.param(
        FULL.replace("[[tenants.initech.on_call]]", "[tenants.initech.on_call]"),
        "tenants.initech.on_call: must be an array of tables ([[tenants.initech.on_call]]), not a table",
        id="table-for-an-array-of-tables",
    ),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("text", "message"), BAD)
def test_bad_input_names_where_it_is_and_writes_nothing(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    before = written()
    for action in ("plan", "apply"):
        with pytest.raises(CommandError) as raised:
            run(action, path)
        assert message in str(raised.value)
        assert "nothing was written" in str(raised.value)
    assert written() == before


@pytest.mark.django_db
def test_a_tool_without_a_lookup_is_applied_with_a_warning(tmp_path: Path) -> None:
    """Its unknowns will always need a person: the plan says so, and the file still applies."""
    blind = TOOL.replace('lookup_url = "https://mail.example.com/v1/messages?key={key}"\n', "")
    assert blind != TOOL
    path = write(tmp_path, blind)
    for action in ("plan", "apply"):
        out = run(action, path)
        assert (
            'warning: tools."mail.send".config: no lookup_url: the reconciler cannot look this tool\'s calls up'
        ) in out
    assert Tool.objects.filter(name="mail.send").exists()
    assert "warning" not in run("plan", write(tmp_path, TOOL, "seeing.toml"))


# --- export -----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_an_export_applied_at_once_changes_nothing(tmp_path: Path, tenant_a: Tenant, operator_a: Any) -> None:
    run("apply", write(tmp_path, FULL))
    since = head("initech"), head("acme")
    target = tmp_path / "export.toml"

    call_command("ledger_config", "export", str(target), stdout=io.StringIO(), stderr=io.StringIO())
    exported = tomllib.loads(target.read_text())
    assert exported["tenants"]["acme"]["members"] == {"operator-a": "operator"}
    assert exported["in_process_tools"] == ["charge_card", "open_ticket", "send_email"]
    assert exported["tools"]["mail.send"]["dispatch_lease_seconds"] == 30.0
    assert exported["tools"]["mail.send"]["config"]["headers"] == {"Authorization": "Bearer ${MAIL_TOKEN}"}
    assert exported["tenants"]["initech"]["credentials"] == [
        {"tool": "mail.send", "placeholder": "MAIL_TOKEN", "secret_name": "INITECH_MAIL_TOKEN"}
    ]
    assert exported["tenants"]["acme"]["sla_minutes"] == ""  # empty: the setting's default
    before = written()

    plan = run("apply", str(target))

    assert plan.strip().endswith("nothing to apply")
    assert written() == before
    assert (head("initech"), head("acme")) == since


@pytest.mark.django_db
def test_every_problem_of_the_file_is_named_at_once(tmp_path: Path) -> None:
    text = FULL.replace("max_checks = 4", 'max_checks = "4"').replace('joanna = "approver"', 'joanna = "boss"')
    with pytest.raises(CommandError) as raised:
        run("plan", write(tmp_path, text))
    assert str(raised.value).splitlines() == [
        "2 problems in the file (nothing was written):",
        '  tools."mail.send".max_checks: must be an integer, not a string',
        "  tenants.initech.members.joanna: unknown role 'boss' (one of viewer, operator, approver, admin)",
    ]


#: Beside FULL: a rule with no SLA of its own (empty), one with per-tool SLAs,
#: a disabled email channel, a tool agents run in process, a tenant with
#: settings left empty.
MORE = """
in_process_tools = ["send_email"]

[[tenants.initech.channels]]
name = "mail"
kind = "email"
target = "ops@example.com"
enabled = false

[[tenants.initech.rules]]
event = "sla_overdue"
channel = "mail"
audience = "owner"
tool_sla = { "mail.send" = 5 }

[tenants.umbrella]
name = "Umbrella"
sla_minutes = ""
default_owner = ""
chain_stripes = 2

[tenants.umbrella.policy]
tools = { send_email = [] }
"""


@pytest.mark.django_db
def test_an_export_applied_and_exported_again_is_the_same_file(tmp_path: Path) -> None:
    run("apply", write(tmp_path, MORE + FULL))
    first = run("export")
    assert tomllib.loads(first)["tenants"]["initech"]["rules"][1]["sla_minutes"] == ""

    assert run("apply", write(tmp_path, first, "export.toml")).strip().endswith("nothing to apply")

    assert run("export") == first


@pytest.mark.django_db
def test_export_without_a_file_writes_to_standard_output(tenant_a: Tenant) -> None:
    out = run("export")
    assert "[tenants.acme]" in out
    assert tomllib.loads(out)["tenants"]["acme"]["name"] == "Acme"


# --- the example file -------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_example_file_makes_a_tenant_an_agent_can_use_at_once() -> None:
    run("apply", str(EXAMPLE))

    recorded = recording.record_intent(
        tenant="acme",
        task_id="welcome-1",
        tool_name="drill.send_email",
        idempotency_key="welcome:1",
        args={"to": "new@example.com"},
        credential_scope=["drill:send"],
        actor=Actor.agent("example-agent"),
    )
    assert recorded.created
    assert recorded.attempt.state == State.INTENT_RECORDED
    assert recorded.attempt.credential_scope == "drill:send"

    _, raw = token_create(
        tenant=Tenant.objects.get(slug="acme"),
        name="example agent",
        scopes=["attempts:read", "attempts:write"],
        actor=Actor.system("tests"),
    )
    api = Api(raw)
    body = api.record("welcome:2", tool_name="drill.send_email", credential_scope=["drill:send"])
    assert body["state"] == State.INTENT_RECORDED

    events = AttemptEvent.objects.count()
    assert run("apply", str(EXAMPLE)).strip().endswith("nothing to apply")
    assert AttemptEvent.objects.count() == events


@pytest.mark.django_db
def test_the_example_file_parses_into_one_tenant_with_the_sandbox_tool() -> None:
    desired = config.parse_file(EXAMPLE)
    assert [t.slug for t in desired.tenants] == ["acme"]
    (tool,) = desired.tools
    assert tool.name == "drill.send_email"
    assert tool.values["config"]["dispatch_url"].startswith("http://127.0.0.1:8100/")
    policy = desired.tenants[0].policy
    assert policy is not None
    assert policy.tools == {"drill.send_email": ["drill:send"]}


@pytest.mark.django_db
def test_a_file_matching_the_current_policy_publishes_nothing(tmp_path: Path, tenant_a: Tenant) -> None:
    policy_publish(tenant=tenant_a, tools={"send_email": ["email:send"]}, actor=Actor.system("tests"))
    text = 'in_process_tools = ["send_email"]\n[tenants.acme.policy.tools]\nsend_email = ["email:send"]\n'
    plan = run("plan", write(tmp_path, text))
    assert "unchanged policy of acme v2" in plan


@pytest.mark.django_db
def test_a_shifts_end_moves_and_a_channel_made_disabled_stays_disabled(tmp_path: Path) -> None:
    text = FULL.replace(
        'target = "https://hooks.example.com/ledgerdash"', 'target = "https://hooks.example.com/x"\nenabled = false'
    )
    run("apply", write(tmp_path, text))
    assert Channel.objects.get(name="ops").enabled is False
    since = head("initech")

    moved = text.replace("ends_at = 2099-01-01T16:00:00Z", "ends_at = 2099-01-01T18:00:00+02:00")
    plan = run("apply", write(tmp_path, moved, "moved.toml"))

    assert 'ends_at from "2099-01-01T16:00:00Z" to "2099-01-01T16:00:00Z"' not in plan
    assert "unchanged on-call shift of peter" in plan  # 18:00 at +02:00 is 16:00Z: the same end
    later = text.replace("ends_at = 2099-01-01T16:00:00Z", "ends_at = 2099-01-01T20:00:00Z")
    plan = run("apply", write(tmp_path, later, "later.toml"))
    assert 'ends_at from "2099-01-01T16:00:00Z" to "2099-01-01T20:00:00Z"' in plan
    (event,) = events_of("initech", since)
    assert (event.kind, event.details["changed"]) == ("on_call", ["ends_at"])


@pytest.mark.django_db
def test_a_tenant_is_made_with_its_chains_and_they_cannot_change(tmp_path: Path) -> None:
    striped = FULL.replace('name = "Initech"', 'name = "Initech"\nchain_stripes = 4')
    run("apply", write(tmp_path, striped))
    tenant = Tenant.objects.get(slug="initech")
    assert tenant.chain_stripes == 4
    assert sorted(tenant.chain_heads.values_list("stripe", flat=True)) == [0, 1, 2, 3]
    created = AttemptEvent.objects.filter(tenant=tenant, kind=EventKind.TENANT).order_by("seq").first()
    assert created is not None
    assert created.details["after"]["chain_stripes"] == 4
    assert "chain_stripes = 4" in run("export")
    # Applied again, the same file changes nothing; another number is refused, naming where.
    assert run("plan", write(tmp_path, striped, "again.toml")).strip().endswith("no changes")
    before = written()
    with pytest.raises(CommandError) as raised:
        run("apply", write(tmp_path, striped.replace("chain_stripes = 4", "chain_stripes = 2"), "fewer.toml"))
    assert "tenants.initech.chain_stripes: the tenant's events are kept in 4 chain(s)" in str(raised.value)
    assert written() == before
    assert audit.verify([tenant])[0].ok


@pytest.mark.django_db
def test_the_older_approvals_event_is_applied_with_a_warning_until_held_calls_have_a_rule(tmp_path: Path) -> None:
    """retry_awaiting_approval covered first calls held for approval too; they fire awaiting_approval
    now, and a file that names only the older event is told so (it still works for a release)."""
    older = FULL + '\n[[tenants.initech.rules]]\nevent = "retry_awaiting_approval"\nchannel = "ops"\n'
    out = run("apply", write(tmp_path, older))
    assert "warning: tenants.initech.rules[1]: retry_awaiting_approval no longer stands for first calls" in out
    both = older + '\n[[tenants.initech.rules]]\nevent = "awaiting_approval"\nchannel = "ops"\n'
    assert "warning" not in run("plan", write(tmp_path, both, "both.toml"))
    run("apply", write(tmp_path, both, "both.toml"))
    assert "warning" not in run("plan", write(tmp_path, older, "older.toml"))  # the twin is kept in the database
