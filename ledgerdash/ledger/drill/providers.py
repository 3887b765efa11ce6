"""What the crash drill needs to run against a provider's replica
(``manage.py crashdrill --provider NAME``): the preset its tools use, the
settings that preset needs, and credentials the replica takes (named as
secrets of the drill's own, set in the drill's environment only, so a real
key in the environment is never read, nor sent anywhere)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from ledgerdash.ledger.providers.presets import PRESETS, PresetAdapter

#: The lag the drill's replicas give their search indexes, and its tools their lookups (seconds).
LOOKUP_LAG = 1.0


@dataclass(frozen=True)
class DrillProvider:
    name: str
    preset: str
    settings: dict[str, str] = field(default_factory=dict)
    #: preset option -> the credential the replica takes
    credentials: dict[str, str] = field(default_factory=dict)
    #: The provider's unkind behaviours the drill switches on in its replica (the replica's ``MODES``),
    #: as an account may be set up: the drill holds with them.
    modes: dict[str, Any] = field(default_factory=dict)
    #: Modes the drill leaves off, each with why (where else it is proved).
    left_off: dict[str, str] = field(default_factory=dict)

    @property
    def adapter(self) -> type[PresetAdapter]:
        return PRESETS[self.preset]

    def secret_name(self, option: str) -> str:
        return f"LEDGERDASH_DRILL_{self.name.upper()}_{option.upper()}"

    def config(self, url: str) -> dict[str, Any]:
        """The drill's tools' configuration, pointed at the replica at ``url``."""
        named = {option: "${" + self.secret_name(option) + "}" for option in self.credentials}
        return {"preset": self.preset, "base_url": url, **self.settings, **named}

    def export_credentials(self) -> None:
        """Put the replica's credentials in this process's environment (and so its children's)."""
        for option, value in self.credentials.items():
            os.environ[self.secret_name(option)] = value


PROVIDERS = {
    p.name: p
    for p in (
        DrillProvider(
            "stripe",
            "stripe.payment_intent",
            credentials={"secret_key": "sk_test_crashdrill"},
            modes={
                "search_unavailable": True,
                "account_api_version": "2019-12-03",
                "conflict_as_invalid_request": True,
                "no_retry_after": True,
            },
        ),
        DrillProvider(
            "slack",
            "slack.post_message",
            credentials={"token": "xoxb-crashdrill"},
            modes={"metadata_deleted_every": 4, "metadata_edited_every": 5, "deleted_every": 6},
            left_off={
                "non_marketplace": "one read of history a minute outlasts the seconds a drill case gives recovery "
                "to settle; tests/test_slack_as_it_is.py reads a busy window to its end under it, check by check"
            },
        ),
        DrillProvider(
            "github",
            "github.issue",
            settings={"repository": "crashdrill/drill"},
            credentials={"token": "ghp_drill"},
            # Every few issues one is transferred, moved out of reach, deleted or has its marker edited out;
            # a rate limit comes as a bare 403 (the secondary limit's answer wins over the reset header's).
            modes={
                "transfer_every": 3,
                "transfer_away_every": 7,
                "delete_every": 5,
                "marker_removed_every": 4,
                "secondary_limit": True,
                "reset_header": True,
            },
            left_off={
                mode: "the drill's calls open issues and make no comment; tests/test_github_as_it_is.py finds "
                "comments edited and deleted since"
                for mode in ("comment_edited_every", "comment_deleted_every")
            },
        ),
        DrillProvider(
            "postmark",
            "postmark.email",
            settings={"retention_days": "7"},
            credentials={"server_token": "crashdrill"},
            modes={"retention_days": 7},
        ),
        DrillProvider(
            "twilio",
            "twilio.message",
            settings={"account_sid": "AC" + "d" * 32, "number_redaction": "on", "retention_days": "7"},
            credentials={"auth_token": "crashdrill"},
            modes={
                "redact_body": True,
                "redact_number": True,
                "smart_encoding": True,
                "queue_seconds": 2.0,
                "retention_days": 7,
            },
        ),
        DrillProvider(
            "jira",
            "jira.issue",
            settings={"email": "crashdrill@example.com"},
            credentials={"api_token": "crashdrill"},
            modes={"label_removed_every": 3, "property_removed_every": 4},
            left_off={
                "no_labels_on_create_screen": "a project without Labels on its create screen refuses every call "
                "the drill would make; tests/test_jira_as_it_is.py shows the refusal and what it tells the user"
            },
        ),
    )
}


def provider(name: str) -> DrillProvider:
    if name not in PROVIDERS:
        raise ValueError(f"no provider {name!r} to drill; there are: {', '.join(PROVIDERS)}")
    return PROVIDERS[name]
