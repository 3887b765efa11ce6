"""``manage.py set_password``: a person's password set by a script, never by a prompt."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command

pytestmark = pytest.mark.django_db


def test_a_password_from_the_environment_lets_the_person_sign_in(
    make_user: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_user("alice")
    monkeypatch.setenv("ALICE_PASSWORD", "a-long-Passphrase-41")
    out = io.StringIO()
    call_command("set_password", "alice", "--from-env", "ALICE_PASSWORD", stdout=out)
    assert "alice: password set" in out.getvalue()
    assert User.objects.get(username="alice").check_password("a-long-Passphrase-41")


def test_a_password_from_standard_input(make_user: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    make_user("bob")
    monkeypatch.setattr("sys.stdin", io.StringIO("another-long-Passphrase-7\n"))
    call_command("set_password", "bob", "--stdin", stdout=io.StringIO())
    assert User.objects.get(username="bob").check_password("another-long-Passphrase-7")


@pytest.mark.parametrize(
    ("username", "password", "message"),
    [
        ("nobody", "a-long-Passphrase-41", "no person named 'nobody'"),
        ("carol", "", "is not set or empty"),
        ("carol", "carol", "the password was refused"),
    ],
)
def test_what_cannot_be_set_is_refused_and_changes_nothing(
    make_user: Any, monkeypatch: pytest.MonkeyPatch, username: str, password: str, message: str
) -> None:
    carol = make_user("carol")
    before = carol.password
    monkeypatch.setenv("NEW_PASSWORD", password)
    with pytest.raises(CommandError, match=message):
        call_command("set_password", username, "--from-env", "NEW_PASSWORD", stdout=io.StringIO())
    carol.refresh_from_db()
    assert carol.password == before
