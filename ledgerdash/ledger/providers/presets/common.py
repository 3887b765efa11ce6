"""What every preset shares: its facts, its settings, the correlation it
writes into a call, and the HTTP exchange with its provider's API.

A preset is a small adapter for one provider's documented API. It knows
what the generic HTTP adapter cannot be configured to do: bodies that are
not the call's JSON (Stripe's and Twilio's forms, Slack's and Jira's
envelopes), errors carried in a 200 (Slack's ``"ok": false``), lookups that
search by a field the adapter wrote rather than by the key, and matching by
content where nothing can be written (Twilio).

Every call a preset sends carries the ledger's reference for it
(:func:`ref`: a digest of the idempotency key, safe in any provider's field)
and the hash of its arguments, wherever the provider keeps something the
sender chose (metadata, a hidden marker, an entity property, a label); the
lookup finds the call by the reference and reports the hash it finds there,
which the reconciler compares with the attempt's.
"""

from __future__ import annotations

import hashlib
import json
import string
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, ClassVar

from django.conf import settings as django_settings

from ledgerdash.ledger import clock
from ledgerdash.ledger.canonical import canonical_bytes, sha256_hex
from ledgerdash.ledger.errors import InvalidArgs, NothingHappened, PermanentFailure
from ledgerdash.ledger.providers.base import (
    BlindSpot,
    Dispatched,
    Lookup,
    LookupStatus,
    ProviderAmbiguous,
    RateLimited,
    Sought,
    retry_after_seconds,
)
from ledgerdash.ledger.providers.http import HttpCalls, NotSent
from ledgerdash_client import crashpoints

#: The name under which presets write their correlation (metadata keys, marker, property, label prefix).
MARK = "ledgerdash"


def clock_skew() -> timedelta:
    """How far a provider's clock may be from the ledger's (LEDGER_PROVIDER_CLOCK_SKEW_SECONDS):
    a search by the provider's times looks this much wider on either side of the call's."""
    return timedelta(seconds=django_settings.LEDGER_PROVIDER_CLOCK_SKEW_SECONDS)


def args_hash(args: dict[str, Any]) -> str:
    """The ledger's hash of a call's arguments (RFC 8785 JSON, SHA-256), as the attempt records it."""
    return sha256_hex(canonical_bytes(args))


def ref(key: str) -> str:
    """The ledger's reference for the call with idempotency key ``key``: 40
    hex digits of its SHA-256 behind ``ld-``. Fits every provider's field
    (a Jira label, a Stripe metadata value, a search query) whatever the
    key holds."""
    return "ld-" + hashlib.sha256(key.encode()).hexdigest()[:40]


@dataclass(frozen=True)
class Option:
    """One setting of a preset's tool configuration."""

    description: str
    required: bool = False
    default: str = ""


class LookupUnavailable(Exception):
    """The lookup got no usable answer; carries what to tell the operator."""

    def __init__(self, detail: str, retry_after: float | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.retry_after = retry_after


@dataclass(frozen=True)
class Answer:
    status: int
    document: Any
    headers: Mapping[str, str]
    text: str

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


#: How an account's retention applies (:attr:`PresetAdapter.retention_applies`).
WHEN_SENT = "when_sent"
WHEN_READ = "when_read"


class PresetAdapter(HttpCalls):
    """The base of every preset. A subclass states its provider's facts as
    class attributes and implements :meth:`send` and :meth:`search`."""

    #: The preset's name in a tool's configuration (``stripe.payment_intent``).
    name: ClassVar[str]
    provider: ClassVar[str]
    title: ClassVar[str]
    #: Whether the provider performs one effect per idempotency key.
    deduplicates: ClassVar[bool] = False
    #: How long it keeps a key (None: no keys, or for ever).
    retention_seconds: ClassVar[int | None] = None
    #: The documented lag of the lookup this preset uses (0: read-after-write consistent).
    documented_lag_seconds: ClassVar[float] = 0.0
    #: How many days the provider keeps what its lookup reads (None: for as long as it matters).
    kept_days: ClassVar[int | None] = None
    #: Where an account chooses how long that is (fewest, most days): the tool's ``retention_days``
    #: setting says, ``kept_days`` (the provider's default) unless told.
    retention_range: ClassVar[tuple[int, int] | None] = None
    #: Which of the account's choices keeps a call: the one in force when the provider processed it
    #: (:data:`WHEN_SENT`: a change applies to what is processed afterwards), or any in force since
    #: (:data:`WHEN_READ`: a window over what the API shows, a shorter one hiding what was kept).
    retention_applies: ClassVar[str] = WHEN_READ
    default_base_url: ClassVar[str]
    #: The preset's settings beyond ``preset`` and ``base_url``.
    options: ClassVar[dict[str, Option]] = {}
    #: Where the lookup cannot see a call that happened, as the provider documents it:
    #: :meth:`blind` answers NOT_EVIDENCE naming one of these, never NOT_FOUND.
    blind_spots: ClassVar[tuple[BlindSpot, ...]] = ()
    #: Dispatch statuses that are definitive refusals (nothing was done).
    refused_statuses: ClassVar[frozenset[int]] = frozenset({400, 401, 402, 403, 404, 405, 410, 413, 422})

    def __init__(self, tool_name: str, config: Mapping[str, Any], **credentials: Any) -> None:
        super().__init__(tool_name, **credentials)
        self.settings = self.parse_config(config)
        self.base_url = self.settings["base_url"].rstrip("/")
        self.idempotent = self.deduplicates
        #: Whether the tool states its lookup's lag (``lookup_lag_seconds``) rather than taking the preset's.
        self.lag_stated = False
        self.lookup_timeout = 5.0
        days = self.kept_for_days()
        self.lookup_retention = timedelta(days=days) if days is not None else None

    # --- configuration ----------------------------------------------------------------

    @classmethod
    def all_options(cls) -> dict[str, Option]:
        options = {
            "base_url": Option(f"the API's address (default {cls.default_base_url})", default=cls.default_base_url),
            **cls.options,
        }
        if cls.retention_range is not None:
            fewest, most = cls.retention_range
            options["retention_days"] = Option(
                f"how many days {cls.provider} keeps what the lookup reads ({cls.kept_days} unless the account "
                f"chose another, from {fewest} to {most})",
                default=str(cls.kept_days),
            )
        return options

    @classmethod
    def parse_config(cls, config: Mapping[str, Any]) -> dict[str, str]:
        """The tool's settings, every default filled; a clear error for a wrong one."""
        if not isinstance(config, Mapping):
            raise TypeError("a preset tool's config must be a JSON object")
        known = cls.all_options()
        unknown = sorted(set(config) - set(known) - {"preset"})
        if unknown:
            raise ValueError(
                f"unknown settings for preset {cls.name}: {', '.join(unknown)} (known: {', '.join(sorted(known))})"
            )
        settings: dict[str, str] = {}
        for option_name, option in known.items():
            value = config.get(option_name, option.default)
            if not isinstance(value, str):
                raise ValueError(f"preset {cls.name}: {option_name} must be a string, not {value!r}")
            if option.required and not value:
                raise ValueError(f"preset {cls.name} needs {option_name}: {option.description}")
            settings[option_name] = value
        if cls.retention_range is not None:
            fewest, most = cls.retention_range
            days = settings["retention_days"]
            if not days.isdigit() or not fewest <= int(days) <= most:
                raise ValueError(f"preset {cls.name}: retention_days must be a number of days from {fewest} to {most}")
        parts = urllib.parse.urlsplit(settings["base_url"])
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"preset {cls.name}: base_url must be an http(s) URL, not {settings['base_url']!r}")
        for option_name, value in settings.items():
            string.Template(value).get_identifiers()  # a malformed ${...} fails here, not at call time
            if option_name != "base_url" and "${" not in value and option_name in cls.secret_options():
                raise ValueError(
                    f"preset {cls.name}: {option_name} must name a secret as ${{NAME}}, never hold one "
                    "(the database keeps names, not secrets)"
                )
        return settings

    def kept_for_days(self) -> int | None:
        """How many days the provider keeps what the lookup reads (the setting says, where the account chooses)."""
        if self.retention_range is not None:
            return int(self.settings["retention_days"])
        return self.kept_days

    @classmethod
    def secret_options(cls) -> frozenset[str]:
        """The settings that name secrets (``${NAME}``), resolved at call time."""
        return frozenset(name for name, option in cls.options.items() if option.default.startswith("${"))

    def secret(self, option_name: str) -> str:
        """A setting with its ``${NAME}`` secrets filled in (a tenant's binding first)."""
        return self._filled({option_name: self.settings[option_name]}, what="setting")[option_name]

    @classmethod
    def example_args(cls, key: str) -> dict[str, Any]:
        """The arguments of a typical call, naming ``key`` where a person would see it (the drill's calls)."""
        raise NotImplementedError

    # --- what a subclass provides -------------------------------------------------------

    def auth_headers(self) -> dict[str, str]:
        raise NotImplementedError

    def send(self, key: str, args: dict[str, Any], on_request_id: Callable[[str], None] | None) -> Dispatched:
        raise NotImplementedError

    def search(self, sought: Sought) -> Lookup:
        """Find ``sought`` at the provider; raise :class:`LookupUnavailable` when it cannot say."""
        raise NotImplementedError

    # --- the adapter interface ----------------------------------------------------------

    def dispatch(
        self, *, key: str, args: dict[str, Any], on_request_id: Callable[[str], None] | None = None
    ) -> Dispatched:
        try:
            canonical_bytes(args)
        except InvalidArgs as exc:
            raise PermanentFailure(str(exc)) from None
        return self.send(key, args, on_request_id)

    def lookup(self, *, key: str, args_hash: str) -> Lookup:
        return self.find(Sought(key=key, args_hash=args_hash))

    def find(self, sought: Sought) -> Lookup:
        try:
            return self.search(sought)
        except Ambiguous as exc:
            return Lookup(LookupStatus.AMBIGUOUS, detail=exc.detail)
        except Blind as exc:
            return Lookup(LookupStatus.NOT_EVIDENCE, detail=exc.detail, extra={"blind_spot": exc.spot.name})
        except LookupUnavailable as exc:
            return Lookup(LookupStatus.UNAVAILABLE, detail=exc.detail, retry_after=exc.retry_after)
        except NothingHappened as exc:  # a missing credential: nothing was asked
            return Lookup(LookupStatus.UNAVAILABLE, detail=str(exc))

    # --- the exchange ------------------------------------------------------------------

    def call(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | list[tuple[str, str]] | None = None,
        json_body: Any = None,
        form: list[tuple[str, str]] | None = None,
        headers: Mapping[str, str] | None = None,
        sending: bool = False,
    ) -> Answer:
        """One request to the provider. ``sending``: the dispatch itself
        (bounded by the tool's maximum request time, crash points around the
        send, a connection refused is proof nothing was sent). Otherwise a
        lookup: any trouble raises :class:`LookupUnavailable`."""
        url = self.base_url + path
        if params:
            url += "?" + urllib.parse.urlencode(params, doseq=True)
        sent_headers = self._filled({}, {**self.auth_headers(), **(headers or {})})
        body: bytes | None = None
        if json_body is not None:
            body = json.dumps(json_body, separators=(",", ":"), ensure_ascii=False).encode()
            sent_headers["Content-Type"] = "application/json; charset=utf-8"
        elif form is not None:
            body = urllib.parse.urlencode(form).encode()
            sent_headers["Content-Type"] = "application/x-www-form-urlencoded"
        try:
            if sending:
                status, data, got = self._exchange(
                    method,
                    url,
                    body=body,
                    headers=sent_headers,
                    timeout=self.max_request_seconds,
                    before_send=lambda: crashpoints.reached(crashpoints.BEFORE_SEND),
                    after_send=lambda: crashpoints.reached(crashpoints.AFTER_SEND),
                )
            else:
                status, data, got = self._exchange(
                    method, url, body=body, headers=sent_headers, timeout=self.lookup_timeout
                )
        except NotSent as exc:
            if sending:
                raise NothingHappened(f"could not connect to {self.provider}: {exc}") from None
            raise LookupUnavailable(f"could not connect to {self.provider}: {exc}") from None
        except OSError as exc:
            if sending:
                raise
            raise LookupUnavailable(f"{type(exc).__name__}: {exc}") from None
        text = data.decode("utf-8", "replace")
        try:
            document = json.loads(data) if data else None
        except ValueError:
            document = None
        answer = Answer(status, document, {k.lower(): v for k, v in got.items()}, text)
        if self.rate_limited(answer):
            wait = self.retry_after(answer)
            said = f"{self.provider} answered HTTP {status} (too many requests)" + (
                f", retry after {wait:g} s" if wait is not None else ""
            )
            if sending:
                raise RateLimited(said + ": nothing was done", wait)
            raise LookupUnavailable(said, wait)
        if not sending and not answer.ok and status not in self.lookup_absent_statuses():
            raise LookupUnavailable(f"{self.provider} answered HTTP {status}: {text[:200]}")
        return answer

    def rate_limited(self, answer: Answer) -> bool:
        """Whether ``answer`` refuses the request for its rate (nothing was done)."""
        return answer.status == 429

    def retry_after(self, answer: Answer) -> float | None:
        """How long a rate-limited ``answer`` asks the caller to wait (its ``Retry-After``), None: not said."""
        return retry_after_seconds(answer.headers.get("retry-after"))

    def lookup_absent_statuses(self) -> frozenset[int]:
        """Lookup statuses that mean "no such thing" (handled by the subclass, not raised)."""
        return frozenset({404})

    def refuse_or_doubt(self, answer: Answer, what: str) -> None:
        """Raise for a dispatch answer that is not a success: a definitive
        refusal (:class:`PermanentFailure`), or one that does not say whether
        the provider acted (:class:`ProviderAmbiguous`)."""
        if answer.status in self.refused_statuses:
            raise PermanentFailure(f"{self.provider} refused {what} with HTTP {answer.status}: {answer.text[:300]}")
        raise ProviderAmbiguous(
            f"{self.provider} answered HTTP {answer.status} to {what}, which does not say whether it acted: "
            f"{answer.text[:200]}"
        )

    def setup_warnings(self) -> list[str]:
        """What the account's setup at the provider will refuse or hide, read from the provider before
        any call is made (``ledger_config plan`` prints it); nothing, for most presets."""
        return []

    def blind(self, name: str, detail: str) -> Blind:
        """The answer when the call may lie in the blind spot ``name`` (one the preset
        states in :attr:`blind_spots`): raise it from :meth:`search`."""
        spot = next((each for each in self.blind_spots if each.name == name), None)
        if spot is None:
            raise AssertionError(f"{self.name} states no blind spot {name!r}")
        return Blind(spot, f"{detail}; but {spot.what}: not evidence that it was not sent")

    def receipt(self, request_id: str, document: Any, what: str, fate: str) -> Lookup:
        """The effect read by the id its provider answered the call with (the dispatcher recorded it):
        the call's, whatever ``fate`` befell it since, found with nothing to compare."""
        return found(request_id, "", document, f"{what} is the one {self.provider} answered this call with; {fate}")

    def window_end(self, sought: Sought) -> datetime | None:
        """Where a search by time may stop: once the request could no longer
        land, plus the lookup's lag and the clocks' skew (None: not known)."""
        if sought.lands_by is None:
            return None
        return sought.lands_by + timedelta(seconds=self.lookup_lag_seconds) + clock_skew()

    def window_start(self, sought: Sought) -> datetime:
        """Where a search by time begins: the first dispatch claim, less the
        clocks' skew (unknown: a day before the ledger's now)."""
        start = sought.sent_after or clock.now() - timedelta(days=1)
        return start - clock_skew()


def received(on_request_id: Callable[[str], None] | None, request_id: str) -> None:
    """Record the provider's id for the effect the moment it is known."""
    if request_id and on_request_id is not None:
        on_request_id(request_id)


def one_match(matches: list[Any], what: str) -> Any:
    """The single match, or None for none; two or more are for a person (:class:`Ambiguous`)."""
    if len(matches) > 1:
        raise Ambiguous(f"{len(matches)} {what} may be this call's: a person decides which, if any, it is")
    return matches[0] if matches else None


class Ambiguous(LookupUnavailable):
    """More than one effect may be the call's."""


class Blind(LookupUnavailable):
    """Nothing seen, where the lookup could not have seen the call (:meth:`PresetAdapter.blind`)."""

    def __init__(self, spot: BlindSpot, detail: str) -> None:
        super().__init__(detail)
        self.spot = spot


@dataclass(frozen=True)
class Chosen:
    """What a search took for the call, and what it left out."""

    #: The one candidate that may be the call's (None: none).
    match: Any
    #: The provider's ids of candidates the ledger recorded on another side effect.
    left_out: tuple[str, ...] = ()

    @property
    def note(self) -> str:
        """What the lookup's detail says of the candidates left out ("" for none)."""
        if not self.left_out:
            return ""
        shown = ", ".join(self.left_out[:5]) + (", …" if len(self.left_out) > 5 else "")
        them = "it" if len(self.left_out) == 1 else "them"
        return f" ({shown} left out: the ledger recorded {them} on another side effect)"


def choose(candidates: list[Any], sought: Sought, id_of: Callable[[Any], str], what: str) -> Chosen:
    """The one candidate that may be the call's, after leaving out those
    whose provider id the ledger recorded on another side effect
    (:attr:`Sought.elsewhere`): such an effect is another call's however
    alike, so of two alike where one is another's the other is taken, and
    one that is another's is none. Two or more left are for a person
    (:class:`Ambiguous`)."""
    kept: list[Any] = []
    left: list[str] = []
    for candidate in candidates:
        request_id = id_of(candidate)
        if request_id and sought.elsewhere(request_id):
            left.append(request_id)
        else:
            kept.append(candidate)
    return Chosen(one_match(kept, what), tuple(left))


def changed_may_be(
    candidates: list[Any],
    sought: Sought,
    id_of: Callable[[Any], str],
    nothing: str,
    how: str,
    shown_as: Callable[[str], str] = str,
) -> None:
    """Raise :class:`Ambiguous` when an effect the provider changed since it was made, so that it cannot
    be compared with the call (its reference or content gone), may still be the call's: ``nothing`` says
    what the lookup did not find, ``how`` how they were changed, ``shown_as`` how an id reads to a person.
    Those the ledger recorded on another side effect are left out first, as :func:`choose` leaves them."""
    kept = [candidate for candidate in candidates if not sought.elsewhere(id_of(candidate))]
    if kept:
        shown = ", ".join(shown_as(id_of(candidate)) for candidate in kept[:5])
        raise Ambiguous(f"{nothing}; but {shown} {how}: any may be the call's, and a person decides")


def by_content(lookup: Lookup) -> Lookup:
    """``lookup``, marked as a match by the call's content (its arguments)
    rather than by anything of its own: another call with the same
    arguments could have made it (:func:`ledgerdash.ledger.provider_ids.unless_elsewhere`)."""
    return replace(lookup, extra={**lookup.extra, "matched_by": "content"})


def found(
    request_id: str,
    payload_hash: str,
    document: Any,
    detail: str,
) -> Lookup:
    return Lookup(
        LookupStatus.FOUND, request_id=request_id, payload_hash=payload_hash, detail=detail, document=document
    )


def not_found(detail: str, chosen: Chosen | None = None) -> Lookup:
    """Nothing that may be the call's; ``chosen`` says what the search left out (recorded with the lookup)."""
    if chosen is None or not chosen.left_out:
        return Lookup(LookupStatus.NOT_FOUND, detail=detail)
    return Lookup(LookupStatus.NOT_FOUND, detail=detail + chosen.note, extra={"left_out": list(chosen.left_out)})
