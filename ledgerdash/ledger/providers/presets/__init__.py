"""Presets: the providers agents call most, each a documented adapter a
tool names by its preset (``adapter = "preset"``, ``config.preset``), with
what the provider guarantees stated once, as class attributes: whether it
deduplicates and for how long, the lag of its lookup, its settings.

docs/providers.md has a section per preset and the checklist each one followed.
"""

from __future__ import annotations

from ledgerdash.ledger.providers.presets.common import PresetAdapter
from ledgerdash.ledger.providers.presets.github import Issue, IssueComment
from ledgerdash.ledger.providers.presets.jira import JiraIssue
from ledgerdash.ledger.providers.presets.postmark import Email
from ledgerdash.ledger.providers.presets.slack import PostMessage
from ledgerdash.ledger.providers.presets.stripe import PaymentIntent, Refund
from ledgerdash.ledger.providers.presets.twilio import Message

PRESETS: dict[str, type[PresetAdapter]] = {
    cls.name: cls for cls in (PaymentIntent, Refund, PostMessage, Issue, IssueComment, Email, Message, JiraIssue)
}
#: The provider each preset reaches, by the name its replica and ``crashdrill --provider`` use.
PROVIDERS: dict[str, tuple[str, ...]] = {}
for _name in PRESETS:
    PROVIDERS.setdefault(_name.split(".")[0], ())
    PROVIDERS[_name.split(".")[0]] += (_name,)


def preset(name: object) -> type[PresetAdapter]:
    """The preset called ``name``; a clear error naming them all otherwise."""
    if not isinstance(name, str) or name not in PRESETS:
        raise ValueError(f"no preset {name!r}; there are: {', '.join(PRESETS)}")
    return PRESETS[name]


__all__ = ["PRESETS", "PROVIDERS", "PresetAdapter", "preset"]
