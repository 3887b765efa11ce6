"""ledgerdash settings: one module, everything that varies comes from the environment.

See ``.env.example`` for every variable this reads.
"""

from __future__ import annotations

import urllib.parse
from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured
from django.utils.csp import CSP
from whitenoise.compress import Compressor

from ledgerdash.env import env_bool, env_int, env_list, env_str, local_secret_key
from ledgerdash.ops import logs

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("LEDGERDASH_VAR_DIR") or BASE_DIR / "var")

DEBUG = env_bool("DEBUG", False)

SECRET_KEY = env_str("SECRET_KEY")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured(
            "SECRET_KEY must be set when DEBUG is off. For local use set DEBUG=true and a key "
            "is generated into var/secret_key."
        )
    SECRET_KEY = local_secret_key(VAR_DIR / "secret_key")

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost"] if DEBUG else [])
if not DEBUG and not ALLOWED_HOSTS:
    raise ImproperlyConfigured("ALLOWED_HOSTS must be set when DEBUG is off (comma-separated host names).")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "ledgerdash.staticfiles.StaticFiles",  # django.contrib.staticfiles, less what no page serves
    "django_htmx",
    "ninja",  # the interactive API docs' page and static files (/api/v1/docs)
    "axes",
    "ledgerdash.ledger",
    "ledgerdash.notify",
    "reviews",
]

#: The ingest API's requests take their own chain (ledgerdash.middleware.ApiRequests):
#: logged and timed, a database that is away answered with a 503, the security
#: headers, never cached, its length stated. No session, CSRF check or sign-in: a bearer token
#: authenticates each request.
API_MIDDLEWARE = [
    "ledgerdash.middleware.ContentLengthMiddleware",
    "ledgerdash.ops.requests.RequestLogMiddleware",
    "ledgerdash.ops.unavailable.DatabaseUnavailableMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "ledgerdash.middleware.NoStoreMiddleware",
]
MIDDLEWARE = [
    # First: the API's requests go through API_MIDDLEWARE instead of what follows.
    "ledgerdash.middleware.ApiRequests",
    # It times and logs every request, redirects and refusals included.
    "ledgerdash.ops.requests.RequestLogMiddleware",
    # Its process_exception turns a database that is down or too slow into a 503.
    "ledgerdash.ops.unavailable.DatabaseUnavailableMiddleware",
    # Health probes, answered before anything reads the Host header (ledgerdash/ops/health.py).
    "ledgerdash.ops.health.ProbeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Configuration changed in a signed-in person's request is recorded as theirs.
    "ledgerdash.ledger.configuration.ActorMiddleware",
    "ledgerdash.middleware.NoStoreMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django.middleware.csp.ContentSecurityPolicyMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Last, as django-axes requires: it answers a locked account's sign-in.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "ledgerdash.urls"
WSGI_APPLICATION = "ledgerdash.wsgi.application"
#: Called once by ledgerdash/wsgi.py when a web process starts, so the first
#: request does not pay for them: the PDF renderer (WeasyPrint, Pango, fonts).
WSGI_PRELOAD = ["reviews.audit_views.preload_pdf_renderer"]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.template.context_processors.csp",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]


def database_timeouts_ms() -> tuple[int, int]:
    """PostgreSQL's statement_timeout and lock_timeout for the app's
    connections, in milliseconds (0: none): sent as each connection starts,
    or set on the runtime role behind a transaction pooler."""
    return (
        env_int("DATABASE_STATEMENT_TIMEOUT_MS", 30_000, minimum=0),
        env_int("DATABASE_LOCK_TIMEOUT_MS", 10_000, minimum=0),
    )


def _multi_host(url: str) -> tuple[tuple[str, str] | None, str]:
    """libpq's multi-host URL (``postgres://user@db1:5432,db2:5432/name
    ?target_session_attrs=read-write``, a primary and its standbys: each
    connection tries them in turn and keeps the one that takes writes), as
    the comma lists libpq takes for host and port, and the URL with its
    first host alone, for the rest of the parsing."""
    _scheme, sep, rest = url.partition("://")
    netloc = rest.split("/", 1)[0].split("?", 1)[0]
    auth, at, hostlist = netloc.rpartition("@")
    if not sep or "," not in hostlist:
        return None, url
    hosts, ports = [], []
    entries = hostlist.split(",")
    for entry in entries:
        if entry.startswith("["):  # an IPv6 address: [::1]:5432
            address, bracket, after = entry[1:].partition("]")
            host, port = address, after.removeprefix(":")
            if not bracket or (after and not after.startswith(":")):
                host = ""
        else:
            host, _, port = entry.partition(":")
        host = urllib.parse.unquote(host)  # a socket folder is written %2Fvar%2Frun%2Fpostgresql
        if not host or not (port == "" or port.isdigit()):
            raise ImproperlyConfigured(f"DATABASE_URL: {entry!r} in {hostlist!r} is not HOST or HOST:PORT")
        hosts.append(host)
        ports.append(port or "5432")
    return (",".join(hosts), ",".join(ports)), url.replace(netloc, f"{auth}{at}{entries[0]}", 1)


def database_config(url: str) -> dict[str, object]:
    """Django's settings for the database at ``url`` (SQLite or PostgreSQL), with the ledger's defaults."""
    hosts, url = _multi_host(url)
    try:
        config: dict[str, object] = dict(dj_database_url.parse(url))
    except (ValueError, dj_database_url.UnknownSchemeError) as exc:
        raise ImproperlyConfigured(f"DATABASE_URL={url!r} is not a database URL: {exc}") from None
    if hosts:
        config["HOST"], config["PORT"] = hosts
    engine = config.get("ENGINE")
    if engine == "django.db.backends.sqlite3":
        name = Path(str(config["NAME"]))
        if str(name) != ":memory:":
            name.parent.mkdir(parents=True, exist_ok=True)
        defaults: dict[str, object] = {
            # Every ledger transaction writes; taking the write lock up front
            # avoids "database is locked" upgrades between concurrent writers.
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
            # WAL lets readers (the dashboard) run beside the writer; FULL
            # sync because an intent must survive a power cut before dispatch.
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON;",
        }
    elif engine == "django.db.backends.postgresql":
        config["CONN_MAX_AGE"] = env_int("DATABASE_CONN_MAX_AGE", 60, minimum=0)
        # A connection kept from an earlier request is tested before it is
        # used again: after a server restart or a terminated session, the
        # next request reconnects instead of failing.
        config["CONN_HEALTH_CHECKS"] = True
        # Server-side binding lets psycopg prepare the statements a process
        # sends again and again (every transition's compare-and-set and event
        # append) after their fifth use, so the server stops re-planning them.
        # Behind a pooler in transaction mode (PgBouncer), one connection of the
        # server serves many of the app's, one transaction at a time: nothing
        # may outlive a transaction on it. So no prepared statements, no
        # cursor held across transactions, and no settings sent when the
        # connection starts (PgBouncer refuses the ``options`` startup
        # parameter, or drops it where told to ignore it): the timeouts are
        # then the runtime role's own (``manage.py db_roles --create-roles``).
        pooled = env_bool("DATABASE_TRANSACTION_POOLER", False)
        if pooled and "options" in (config.get("OPTIONS") or {}):  # type: ignore[operator]
            raise ImproperlyConfigured(
                "DATABASE_URL sets ?options=, which a pooler in transaction mode refuses "
                "(DATABASE_TRANSACTION_POOLER=true): set those settings on the role instead (ALTER ROLE … SET)"
            )
        if pooled:
            config["DISABLE_SERVER_SIDE_CURSORS"] = True
        binding = env_bool("DATABASE_SERVER_SIDE_BINDING", True) and not pooled
        defaults = {"server_side_binding": True, "prepare_threshold": 5} if binding else {}
        if not pooled:
            # A stalled database becomes a fast error (answered as a 503 with
            # Retry-After) well before gunicorn's worker timeout kills the worker:
            # a statement may run this long, and wait this long for a lock.
            # 0 turns a limit off (a one-off maintenance command may want that).
            statement_ms, lock_ms = database_timeouts_ms()
            defaults["options"] = f"-c statement_timeout={statement_ms} -c lock_timeout={lock_ms}"
        # A server that does not answer (a host that hangs, a failed-over
        # primary's address) costs a new connection this long, then the next
        # host of a multi-host URL is tried.
        defaults["connect_timeout"] = env_int("DATABASE_CONNECT_TIMEOUT", 10, minimum=1)
        if env_bool("DATABASE_POOL", False):
            # psycopg's pool in each process (Django's OPTIONS["pool"]): connections
            # are reused across requests without a pooler in front. A process
            # holds at most max_size; a request that finds none free within the
            # timeout answers 503. Persistent connections are the pool's job.
            config["CONN_MAX_AGE"] = 0
            defaults["pool"] = {
                "min_size": env_int("DATABASE_POOL_MIN_SIZE", 1, minimum=0),
                "max_size": env_int("DATABASE_POOL_MAX_SIZE", 4, minimum=1),
                "timeout": env_int("DATABASE_POOL_TIMEOUT", 10, minimum=1),
            }
    else:
        raise ImproperlyConfigured(f"DATABASE_URL uses {engine}; ledgerdash supports sqlite:/// and postgres:// URLs.")
    # Options given in the URL (``?sslmode=require``) are kept, over these defaults.
    given = dict(config.get("OPTIONS") or {})  # type: ignore[call-overload]
    if "options" in given and "options" in defaults:
        # Server settings from the URL (?options=-c%20search_path%3Dx) come after, so they win.
        given["options"] = f"{defaults['options']} {given['options']}"
    config["OPTIONS"] = {**defaults, **given}
    return config


DATABASE_URL = env_str("DATABASE_URL") or f"sqlite:///{VAR_DIR / 'ledgerdash.sqlite3'}"
DATABASES = {"default": database_config(DATABASE_URL)}
DATABASE_TIMEOUTS_MS = database_timeouts_ms()
#: The app reaches PostgreSQL through a pooler in transaction mode (see database_config).
DATABASE_TRANSACTION_POOLER = env_bool("DATABASE_TRANSACTION_POOLER", False)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# django-axes first: it refuses a locked account before any password is checked.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
# Sign-in throttling (reviews/accounts.py): an account is locked after this
# many failed sign-ins in a row, on /login/ and /admin/ alike, for the
# cool-off or until an admin of one of its tenants unlocks it.
AXES_FAILURE_LIMIT = env_int("LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("LOGIN_LOCKOUT_MINUTES", 60, minimum=1))
# By account, not by address: behind a proxy every client shares one address
# (one attacker would lock everyone out), and an account tried from many
# addresses must still lock. Spraying one password over many accounts from
# one address is for the proxy's rate limit (docs/security.md).
AXES_LOCKOUT_PARAMETERS = ["username"]
SILENCED_SYSTEM_CHECKS = ["axes.W006"]  # "no ip_address in AXES_LOCKOUT_PARAMETERS": on purpose, above
AXES_RESET_ON_SUCCESS = True
# A refused attempt during a lockout neither extends it nor writes anything.
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_LOCKOUT_CALLABLE = "reviews.accounts.lockout_response"
AXES_VERBOSE = False
# Single sign-on with OpenID Connect (reviews/sso.py), beside local accounts,
# which stay for break-glass. Roles come from the provider's groups claim:
# OIDC_GROUP_ROLES="acme-ops=acme:operator,acme-leads=acme:approver".
OIDC_ENABLED = env_bool("OIDC_ENABLED", False)
if OIDC_ENABLED:

    def _oidc(name: str) -> str:
        value = env_str(name)
        if not value:
            raise ImproperlyConfigured(f"{name} must be set when OIDC_ENABLED is on (see .env.example)")
        return value

    AUTHENTICATION_BACKENDS.append("reviews.sso.TenantRolesBackend")
    OIDC_OP_ISSUER = _oidc("OIDC_OP_ISSUER")
    OIDC_OP_AUTHORIZATION_ENDPOINT = _oidc("OIDC_OP_AUTHORIZATION_ENDPOINT")
    OIDC_OP_TOKEN_ENDPOINT = _oidc("OIDC_OP_TOKEN_ENDPOINT")
    OIDC_OP_USER_ENDPOINT = _oidc("OIDC_OP_USER_ENDPOINT")
    OIDC_OP_JWKS_ENDPOINT = _oidc("OIDC_OP_JWKS_ENDPOINT")
    OIDC_RP_CLIENT_ID = _oidc("OIDC_RP_CLIENT_ID")
    OIDC_RP_CLIENT_SECRET = _oidc("OIDC_RP_CLIENT_SECRET")
    OIDC_RP_SIGN_ALGO = "RS256"  # the provider's published key, never the shared secret
    OIDC_RP_SCOPES = env_str("OIDC_RP_SCOPES", "openid email profile groups")
    OIDC_USE_PKCE = True
    OIDC_TIMEOUT = 10
    OIDC_GROUPS_CLAIM = env_str("OIDC_GROUPS_CLAIM", "groups")
    OIDC_GROUP_ROLES = env_str("OIDC_GROUP_ROLES")
    LOGIN_REDIRECT_URL_FAILURE = "/login/?sso=failed"
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "reviews:home"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# Where `collectstatic` writes the hashed files whitenoise serves with DEBUG off.
STATIC_ROOT = Path(env_str("STATIC_ROOT") or BASE_DIR / "staticfiles")
STATICFILES_DIRS = [BASE_DIR / "static"]
# Source maps (Swagger UI's, for /api/v1/docs) are collected but not compressed: no page loads
# them, and compressing 2 MB of them twice would slow every first start (ledgerdash/staticfiles.py).
WHITENOISE_SKIP_COMPRESS_EXTENSIONS = [*Compressor.SKIP_COMPRESS_EXTENSIONS, "map"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": (
            "django.contrib.staticfiles.storage.StaticFilesStorage"
            if DEBUG
            else "whitenoise.storage.CompressedManifestStaticFilesStorage"
        )
    },
}

# Strict CSP: nothing inline without this request's nonce, nothing from elsewhere.
SECURE_CSP = {
    "default-src": [CSP.SELF],
    "script-src": [CSP.SELF, CSP.NONCE],
    "style-src": [CSP.SELF, CSP.NONCE],
    "img-src": [CSP.SELF, "data:"],
    "connect-src": [CSP.SELF],
    "object-src": [CSP.NONE],
    "base-uri": [CSP.NONE],
    "frame-ancestors": [CSP.NONE],
    "form-action": [CSP.SELF],
}
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SESSION_COOKIE_HTTPONLY = True
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if env_bool("BEHIND_TLS_PROXY", False) else None
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", not DEBUG)
# Probes and scrapers speak plain HTTP to the process itself, not through the proxy.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
SESSION_COOKIE_SECURE = env_bool("SECURE_COOKIES", not DEBUG)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0 if DEBUG else 31536000, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = SECURE_HSTS_SECONDS > 0
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", SECURE_HSTS_SECONDS > 0)

# --- the ledger -----------------------------------------------------------
# How long an API worker keeps a token it has checked before looking it up
# again: a revoked token (or a deactivated tenant) is refused by every worker
# within this many seconds (at once by the one that revoked it). 0: never kept.
LEDGER_TOKEN_CACHE_SECONDS = env_int("LEDGER_TOKEN_CACHE_SECONDS", 5, minimum=0)
# The store's fast paths to switch off (ledgerdash/ledger/store/switches.py
# names them); empty: every one is on. The answers are the same either way.
LEDGER_FAST_PATHS_OFF = (
    frozenset(env_list("LEDGER_FAST_PATHS_OFF", [])) if env_str("LEDGER_FAST_PATHS_OFF").strip() else frozenset()
)
#: A JSON file of secret names to values (provider credentials that tools and
#: tenants' credential bindings name); empty: secrets come from the environment only.
LEDGERDASH_SECRETS_FILE = env_str("LEDGERDASH_SECRETS_FILE")
# A DISPATCHED attempt with no outcome after this long is UNKNOWN.
LEDGER_DISPATCH_LEASE_SECONDS = env_int("LEDGER_DISPATCH_LEASE_SECONDS", 60, minimum=1)
# The longest one request to a provider may take, for tools without a row of
# their own in the Tool table (a tool's row sets its own). The dispatch lease
# must exceed it: a request still in flight must never look lost.
LEDGER_MAX_REQUEST_SECONDS = env_int("LEDGER_MAX_REQUEST_SECONDS", 30, minimum=1)
if LEDGER_MAX_REQUEST_SECONDS >= LEDGER_DISPATCH_LEASE_SECONDS:
    raise ImproperlyConfigured(
        f"LEDGER_MAX_REQUEST_SECONDS ({LEDGER_MAX_REQUEST_SECONDS}) must be below "
        f"LEDGER_DISPATCH_LEASE_SECONDS ({LEDGER_DISPATCH_LEASE_SECONDS})"
    )
# How long a reconciler's claim keeps other reconcilers off an attempt; a
# reconciler that dies mid-batch leaves its claims for this long.
LEDGER_RECONCILER_CLAIM_SECONDS = env_int("LEDGER_RECONCILER_CLAIM_SECONDS", 120, minimum=1)
# An INTENT_RECORDED attempt nobody dispatched after this long is abandoned.
LEDGER_INTENT_LEASE_SECONDS = env_int("LEDGER_INTENT_LEASE_SECONDS", 900, minimum=1)
#: How long an agent is told to wait (Retry-After) before calling again for
#: a call that waits for an approver.
LEDGER_APPROVAL_RETRY_AFTER_SECONDS = env_int("LEDGER_APPROVAL_RETRY_AFTER_SECONDS", 30, minimum=1)
#: How old UNKNOWN and MANUAL_REVIEW work may get before the overview calls
#: it late, for a tenant that sets no SLA of its own.
LEDGER_DEFAULT_SLA_MINUTES = env_int("LEDGER_DEFAULT_SLA_MINUTES", 240, minimum=1)
# How often each process reads the database server's clock again (seconds);
# between readings it carries that time on its own monotonic clock, which
# may drift 0.1% of this (ledgerdash/ledger/clock.py).
LEDGER_CLOCK_READ_SECONDS = env_int("LEDGER_CLOCK_READ_SECONDS", 30, minimum=1)
# How far a provider's clock may be from the ledger's: a lookup that searches
# the provider's records by their time looks this much wider on both sides.
# Past it, such a lookup may miss an effect (docs/protocol.md, C3).
LEDGER_PROVIDER_CLOCK_SKEW_SECONDS = env_int("LEDGER_PROVIDER_CLOCK_SKEW_SECONDS", 300, minimum=0)
# Largest normalized arguments, in bytes of canonical JSON, and deepest nesting.
LEDGER_MAX_ARGS_BYTES = env_int("LEDGER_MAX_ARGS_BYTES", 64 * 1024, minimum=2)
LEDGER_MAX_ARGS_DEPTH = env_int("LEDGER_MAX_ARGS_DEPTH", 32, minimum=1)
# Largest ingest API request body; larger ones are refused (413) unread.
LEDGER_API_MAX_BODY_BYTES = env_int("LEDGER_API_MAX_BODY_BYTES", 512 * 1024, minimum=1024)
# Django refuses bodies over its own limit with a 400; keep it out of the API's way.
DATA_UPLOAD_MAX_MEMORY_SIZE = max(2621440, LEDGER_API_MAX_BODY_BYTES)

# --- notifications (ledgerdash.notify, sent by `manage.py notify`) ----------
# The dashboard's address as people reach it: links in notifications point here.
LEDGERDASH_BASE_URL = env_str("LEDGERDASH_BASE_URL", "http://127.0.0.1:8000").rstrip("/")
# A failed try n waits NOTIFY_BACKOFF_SECONDS * 2**(n-1), at most
# NOTIFY_MAX_BACKOFF_SECONDS; after NOTIFY_MAX_TRIES the delivery is dead
# (shown to the tenant's admins, who can send it again).
NOTIFY_MAX_TRIES = env_int("NOTIFY_MAX_TRIES", 8, minimum=1)
NOTIFY_BACKOFF_SECONDS = env_int("NOTIFY_BACKOFF_SECONDS", 30, minimum=1)
NOTIFY_MAX_BACKOFF_SECONDS = env_int("NOTIFY_MAX_BACKOFF_SECONDS", 3600, minimum=1)
# How long one send may take, and how long a worker's claim on a delivery
# keeps other workers off it (longer than a send, so a slow send is not doubled).
NOTIFY_SEND_TIMEOUT_SECONDS = env_int("NOTIFY_SEND_TIMEOUT_SECONDS", 10, minimum=1)
NOTIFY_CLAIM_SECONDS = env_int("NOTIFY_CLAIM_SECONDS", 60, minimum=1)
if NOTIFY_CLAIM_SECONDS <= NOTIFY_SEND_TIMEOUT_SECONDS:
    raise ImproperlyConfigured("NOTIFY_CLAIM_SECONDS must exceed NOTIFY_SEND_TIMEOUT_SECONDS")

# Email (notification channels of kind email) goes through Django's default
# mailer: SMTP at EMAIL_HOST when it is set; else, with DEBUG on, the console
# (each message is written to the process's output), and with DEBUG off none:
# an email delivery then fails, saying so, until EMAIL_HOST is set.
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "ledgerdash@localhost")
if env_str("EMAIL_HOST"):
    MAILERS = {
        "default": {
            "BACKEND": "django.core.mail.backends.smtp.EmailBackend",
            "OPTIONS": {
                "host": env_str("EMAIL_HOST"),
                "port": env_int("EMAIL_PORT", 587, minimum=1),
                "username": env_str("EMAIL_HOST_USER"),
                "password": env_str("EMAIL_HOST_PASSWORD"),
                "use_tls": env_bool("EMAIL_USE_TLS", True),
                "timeout": NOTIFY_SEND_TIMEOUT_SECONDS,
            },
        }
    }
elif DEBUG:
    MAILERS = {"default": {"BACKEND": "django.core.mail.backends.console.EmailBackend"}}
else:
    MAILERS = {}
    # Django warns (mail.W001) at every command that no default mailer is set;
    # here that is a choice (a deployment need not send email), and a channel
    # of kind email says so when it tries (ledgerdash/notify/senders.py).
    SILENCED_SYSTEM_CHECKS = [*SILENCED_SYSTEM_CHECKS, "mail.W001"]

# --- operations -------------------------------------------------------------
# /metrics answers only with this bearer token (and 404 without one set).
METRICS_TOKEN = env_str("METRICS_TOKEN")
if METRICS_TOKEN and len(METRICS_TOKEN) < 16:
    raise ImproperlyConfigured("METRICS_TOKEN must be at least 16 characters (or empty to turn /metrics off)")

# plain: one readable line per record, for a terminal; json: one JSON object
# per line with the record's fields (request id, tenant, attempt, fence,
# decision), for a log pipeline.
LOG_FORMAT = env_str("LOG_FORMAT", "plain").strip().lower()
if LOG_FORMAT not in logs.FORMATS:
    raise ImproperlyConfigured(f"LOG_FORMAT={LOG_FORMAT!r}: use plain or json")
LOGGING = logs.config(LOG_FORMAT, env_str("LOG_LEVEL", "INFO"))
