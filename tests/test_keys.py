"""One rule for idempotency keys in the ledger, the HTTP API and the Python client:
keys that look alike must be equal, so look-alike spellings are refused, not rewritten."""

from __future__ import annotations

import unicodedata
from typing import Any

import pytest

import ledgerdash_client as ledger
from ledgerdash.ledger import recording
from ledgerdash.ledger.errors import InvalidKey
from ledgerdash.ledger.models import Attempt, Tenant
from ledgerdash_client import keys
from tests.api_support import Api, intent, issue_token
from tests.conftest import ledger_snapshot, record
from tests.test_client import Stub, _client, stub  # noqa: F401 - the stub server fixture

COMPOSED = "invoice:café:send"  # "é" as U+00E9, the NFC form
assert unicodedata.is_normalized("NFC", COMPOSED)

LOOK_ALIKES = [
    ("NFD: e plus a combining acute", unicodedata.normalize("NFD", COMPOSED), "NFC"),
    ("fullwidth letters", "\uff49\uff4e\uff56\uff4f\uff49\uff43\uff45:7:send", "compatibility character U+FF49"),
    ("a ligature", "\ufb01le:7:upload", "compatibility character U+FB01"),
    ("a non-breaking space", "invoice 7\u00a0send", "compatibility character U+00A0"),
    ("a superscript digit", "invoice:7\u00b2:send", "compatibility character U+00B2"),
    ("a right-to-left override", "invoice:\u202e7:send", "U+202E RIGHT-TO-LEFT OVERRIDE"),
    ("a bidi isolate", "invoice:\u20667\u2069:send", "U+2066 LEFT-TO-RIGHT ISOLATE"),
    ("a zero-width space", "invoice:\u200b7:send", "U+200B ZERO WIDTH SPACE"),
    ("a zero-width joiner", "invoice:7\u200d:send", "U+200D ZERO WIDTH JOINER"),
    ("a byte-order mark", "\ufeffinvoice:7:send", "U+FEFF"),
    ("a soft hyphen", "invoice:7\u00ad:send", "U+00AD SOFT HYPHEN"),
    ("a variation selector", "invoice:7\ufe0f:send", "U+FE0F VARIATION SELECTOR-16"),
    ("a Hangul filler", "invoice:\u31647:send", "U+3164 HANGUL FILLER"),
    ("a line separator", "invoice:7\u2028send", "U+2028 LINE SEPARATOR"),
    ("a control character", "invoice:7\x1bsend", "U+001B"),
    ("an unassigned code point", "invoice:7\U000e0080:send", "U+E0080"),
]
IDS = [case[0] for case in LOOK_ALIKES]


@pytest.mark.parametrize(("case", "key", "named"), LOOK_ALIKES, ids=IDS)
def test_the_rule_refuses_look_alike_keys_and_says_why(case: str, key: str, named: str) -> None:
    problem = keys.key_problem(key)
    assert problem is not None
    assert named in problem


@pytest.mark.parametrize(
    "key",
    [COMPOSED, "invoice:7:send", "請求書:7:送信", "فاتورة:7", "Ωmega:7", "a b", "k" * 255, "emoji:🧾"],
)
def test_the_rule_accepts_ordinary_keys_in_any_script(key: str) -> None:
    assert keys.key_problem(key) is None


@pytest.mark.parametrize("code", range(128))
def test_printable_ascii_passes_without_the_unicode_checks_and_nothing_else_does(code: int) -> None:
    key = f"invoice:{chr(code)}:7"
    assert keys.key_problem(key) == keys.unicode_problem(key)
    assert (keys.key_problem(key) is None) == (0x20 <= code < 0x7F)


def test_a_refusal_names_the_form_to_send_instead() -> None:
    problem = keys.key_problem(unicodedata.normalize("NFD", COMPOSED))
    assert problem is not None
    assert repr(COMPOSED) in problem
    problem = keys.key_problem("\uff49\uff4e\uff56\uff4f\uff49\uff43\uff45:7")
    assert problem is not None
    assert "'invoice:7'" in problem


@pytest.mark.parametrize(("case", "key", "named"), LOOK_ALIKES, ids=IDS)
def test_recording_refuses_a_look_alike_of_a_recorded_key_and_writes_nothing(
    tenant_a: Tenant, case: str, key: str, named: str
) -> None:
    record(tenant_a, COMPOSED)
    snapshot = ledger_snapshot()
    with pytest.raises(InvalidKey, match="idempotency key") as caught:
        record(tenant_a, key)
    assert named in str(caught.value)
    assert ledger_snapshot() == snapshot
    assert Attempt.objects.filter(tenant=tenant_a).count() == 1


def test_the_nfc_form_of_a_key_finds_the_attempt_recorded_under_it(tenant_a: Tenant) -> None:
    first = record(tenant_a, COMPOSED)
    again = recording.record_intent(
        tenant=tenant_a,
        task_id="task-1",
        tool_name="send_email",
        idempotency_key=unicodedata.normalize("NFC", unicodedata.normalize("NFD", COMPOSED)),
        args={"to": "ap@example.com", "invoice": 7},
    )
    assert (again.attempt.pk, again.created) == (first.pk, False)


@pytest.mark.parametrize(("case", "key", "named"), LOOK_ALIKES, ids=IDS)
def test_the_api_answers_422_invalid_idempotency_key_and_writes_nothing(
    tenant_a: Tenant, case: str, key: str, named: str
) -> None:
    api = Api(issue_token(tenant_a))
    api.record(COMPOSED)
    snapshot = ledger_snapshot()
    response = api.post("/attempts", intent(key))
    assert response.status_code == 422
    body = response.json()
    assert body["code"] == "invalid_idempotency_key"
    assert named in body["message"]
    assert ledger_snapshot() == snapshot
    found = api.get("/attempts", {"idempotency_key": key})
    assert (found.status_code, found.json()["code"]) == (422, "invalid_idempotency_key")


@pytest.mark.parametrize(("case", "key", "named"), LOOK_ALIKES, ids=IDS)
def test_the_client_refuses_the_key_before_sending_anything(
    stub: Stub,  # noqa: F811
    case: str,
    key: str,
    named: str,
) -> None:
    client = _client(stub.url)
    with pytest.raises(ledger.InvalidKey) as caught:
        client.record_intent(task_id="t", tool_name="send_email", idempotency_key=key, args={})
    assert caught.value.code == "invalid_idempotency_key"
    assert named in str(caught.value)
    with pytest.raises(ledger.InvalidKey):
        client.find(key)
    assert stub.seen == []


def test_the_client_wrapper_refuses_a_key_template_that_builds_a_look_alike(stub: Stub) -> None:  # noqa: F811
    @ledger.tool("send_email", key="invoice:{invoice}:send")
    def send(call: Any, *, invoice: str) -> None:
        raise AssertionError("the tool must not be called")

    with ledger.task(task_id="t", client=_client(stub.url)), pytest.raises(ledger.InvalidKey):
        send(invoice="\uff29\uff2e\uff36-7")  # fullwidth, as pasted from a document
    assert stub.seen == []
