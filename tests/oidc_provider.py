"""A small OpenID Connect provider for the single sign-on tests, built on Authlib.

Run as its own process (``python -m tests.oidc_provider --port … --config FILE``)
so the dashboard talks to it over HTTP exactly as it would to a real identity
provider: the authorization code flow with PKCE and a nonce (Authlib's
``AuthorizationCodeGrant`` with ``OpenIDCode`` and ``CodeChallenge``), ID
tokens signed RS256 with a key made at start-up and published at ``/jwks``,
client authentication at the token endpoint, and a UserInfo endpoint that
answers for the access token it issued. People sign in at ``/authorize`` with
a username and password from the config file (sub, email, groups).

Only what a test needs is kept in memory; nothing here is part of ledgerdash.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import secrets
import threading
import time
import traceback
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# Plain HTTP on loopback: the provider and the dashboard both run in the test.
os.environ.setdefault("AUTHLIB_INSECURE_TRANSPORT", "1")

from authlib.common.security import generate_token
from authlib.oauth2 import AuthorizationServer
from authlib.oauth2.rfc6749 import ClientMixin, OAuth2Request
from authlib.oauth2.rfc6749.grants import AuthorizationCodeGrant
from authlib.oauth2.rfc6749.requests import BasicOAuth2Payload, JsonPayload, JsonRequest
from authlib.oauth2.rfc6750 import BearerTokenGenerator
from authlib.oauth2.rfc7636 import CodeChallenge
from authlib.oidc.core import UserInfo
from authlib.oidc.core.grants import OpenIDCode
from joserfc.jwk import RSAKey

LOCK = threading.Lock()


class Client(ClientMixin):
    def __init__(self, client_id: str, secret: str, redirect_uri: str) -> None:
        self.client_id, self.secret, self.redirect_uri = client_id, secret, redirect_uri

    def get_client_id(self) -> str:
        return self.client_id

    def get_default_redirect_uri(self) -> str:
        return self.redirect_uri

    def get_allowed_scope(self, scope: str) -> str:
        allowed = {"openid", "email", "profile", "groups"}
        return " ".join(s for s in scope.split() if s in allowed)

    def check_redirect_uri(self, redirect_uri: str) -> bool:
        return redirect_uri == self.redirect_uri

    def check_client_secret(self, client_secret: str) -> bool:
        return secrets.compare_digest(client_secret, self.secret)

    def check_endpoint_auth_method(self, method: str, endpoint: str) -> bool:
        return method == "client_secret_post" if endpoint == "token" else True

    def check_response_type(self, response_type: str) -> bool:
        return response_type == "code"

    def check_grant_type(self, grant_type: str) -> bool:
        return grant_type == "authorization_code"


class Code(dict):  # type: ignore[type-arg]
    """An issued authorization code and what it was issued for (Authlib reads
    some of it as attributes, some through getters)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def get_redirect_uri(self) -> str:
        return str(self["redirect_uri"])

    def get_scope(self) -> str:
        return str(self["scope"])

    def get_nonce(self) -> str | None:
        return self.get("nonce")

    def get_auth_time(self) -> int:
        return int(self["auth_time"])

    def get_acr(self) -> None:
        return None

    def get_amr(self) -> None:
        return None

    def get_code_challenge(self) -> str | None:
        return self.get("code_challenge")

    def get_code_challenge_method(self) -> str | None:
        return self.get("code_challenge_method")


class Request(OAuth2Request):
    """An HTTP request as Authlib's core expects one."""

    def __init__(self, method: str, uri: str, headers: dict[str, str], args: dict[str, str], form: dict[str, str]):
        super().__init__(method, uri, headers=headers)
        self._args, self._form = args, form
        self.payload = BasicOAuth2Payload({**args, **form})

    @property
    def args(self) -> dict[str, str]:
        return self._args

    @property
    def form(self) -> dict[str, str]:
        return self._form


class Provider(AuthorizationServer):
    def __init__(self, issuer: str, client: Client, users: dict[str, dict[str, Any]]) -> None:
        super().__init__(scopes_supported=["openid", "email", "profile", "groups"])
        self.issuer, self.client, self.users = issuer, client, users
        self.key = RSAKey.generate_key(2048, parameters={"kid": secrets.token_hex(8), "alg": "RS256", "use": "sig"})
        self.codes: dict[str, Code] = {}
        self.tokens: dict[str, tuple[dict[str, Any], str]] = {}
        self.nonces: set[str] = set()
        self.register_token_generator(
            "default", BearerTokenGenerator(access_token_generator=lambda *args, **kwargs: generate_token(42))
        )
        self.register_grant(CodeGrant, [OpenIDGrant(self, require_nonce=True), CodeChallenge(required=True)])

    def query_client(self, client_id: str) -> Client | None:
        return self.client if client_id == self.client.client_id else None

    def save_token(self, token: dict[str, Any], request: Any) -> None:
        with LOCK:
            self.tokens[token["access_token"]] = (request.user, token["scope"])

    def create_oauth2_request(self, request: Any) -> Any:
        return request

    def create_json_request(self, request: Any) -> Any:
        json_request = JsonRequest(request.method, request.uri, request.headers)
        json_request.payload = JsonPayload(request.form)
        return json_request

    def handle_response(self, status: int, body: Any, headers: Any) -> tuple[int, Any, list[tuple[str, str]]]:
        return status, body, list(headers)

    def send_signal(self, name: str, *args: Any, **kwargs: Any) -> None:
        pass


class CodeGrant(AuthorizationCodeGrant):
    TOKEN_ENDPOINT_AUTH_METHODS = ["client_secret_post"]
    server: Provider

    def save_authorization_code(self, code: str, request: Any) -> Code:
        data = request.payload.data
        issued = Code(
            code=code,
            user=request.user,
            redirect_uri=data.get("redirect_uri", ""),
            scope=request.client.get_allowed_scope(data.get("scope", "")),
            nonce=data.get("nonce"),
            code_challenge=data.get("code_challenge"),
            code_challenge_method=data.get("code_challenge_method"),
            auth_time=int(time.time()),
        )
        with LOCK:
            self.server.codes[code] = issued
            if issued["nonce"]:
                self.server.nonces.add(issued["nonce"])
        return issued

    def query_authorization_code(self, code: str, client: Client) -> Code | None:
        return self.server.codes.get(code)

    def delete_authorization_code(self, authorization_code: Code) -> None:
        with LOCK:
            self.server.codes.pop(authorization_code["code"], None)  # single use

    def authenticate_user(self, authorization_code: Code) -> dict[str, Any]:
        return dict(authorization_code["user"])


class OpenIDGrant(OpenIDCode):
    def __init__(self, provider: Provider, require_nonce: bool) -> None:
        super().__init__(require_nonce=require_nonce)
        self.provider = provider

    def exists_nonce(self, nonce: str, request: Any) -> bool:
        """Whether a code was already issued with this nonce (checked before issuing another)."""
        with LOCK:
            return nonce in self.provider.nonces

    def resolve_client_private_key(self, client: Client) -> RSAKey:
        return self.provider.key

    def get_client_algorithm(self, client: Client) -> str:
        return "RS256"

    def get_client_claims(self, client: Client) -> dict[str, Any]:
        return {"iss": self.provider.issuer, "aud": [client.get_client_id()]}

    def get_encode_header(self, client: Client) -> dict[str, Any]:
        return {"alg": "RS256", "kid": self.provider.key.kid}

    def generate_user_info(self, user: dict[str, Any], scope: str) -> UserInfo:
        return user_info(user, scope)


def user_info(user: dict[str, Any], scope: str) -> UserInfo:
    info = UserInfo(sub=user["sub"])
    if "email" in scope.split():
        info["email"] = user.get("email", "")
    if "profile" in scope.split():
        info["preferred_username"] = user.get("username", "")
        info["name"] = user.get("name", "")
    if "groups" in scope.split():
        info["groups"] = list(user.get("groups", []))
    return info


LOGIN_FORM = """<!doctype html><title>Sign in</title><form method="post" action="/authorize">{hidden}
<input name="username"><input name="password" type="password"><button>Sign in</button></form>"""


def handler_for(provider: Provider, base: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, status: int, body: Any, headers: list[tuple[str, str]] | None = None) -> None:
            raw = body if isinstance(body, bytes) else (body if isinstance(body, str) else json.dumps(body)).encode()
            self.send_response(status)
            names = {name.lower() for name, _ in headers or []}
            for name, value in headers or []:
                self.send_header(name, value)
            if "content-type" not in names:
                self.send_header("Content-Type", "application/json" if not isinstance(body, str) else "text/html")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def _request(self) -> Request:
            parsed = urllib.parse.urlsplit(self.path)
            args = dict(urllib.parse.parse_qsl(parsed.query))
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length).decode() if length else ""
            form = dict(urllib.parse.parse_qsl(body)) if self.command == "POST" else {}
            return Request(self.command, base + self.path, dict(self.headers.items()), args, form)

        def do_GET(self) -> None:
            path = urllib.parse.urlsplit(self.path).path
            if path == "/.well-known/openid-configuration":
                self._send(200, discovery(base))
            elif path == "/jwks":
                self._send(200, {"keys": [provider.key.as_dict(private=False)]})
            elif path == "/authorize":
                request = self._request()
                try:
                    provider.get_consent_grant(request=request, end_user=None)
                except Exception as exc:
                    self._send(400, {"error": str(exc)})
                    return
                hidden = "".join(
                    f'<input type="hidden" name="{html.escape(k)}" value="{html.escape(v)}">'
                    for k, v in request.args.items()
                )
                self._send(200, LOGIN_FORM.format(hidden=hidden))
            elif path == "/userinfo":
                token = (self.headers.get("Authorization") or "").removeprefix("Bearer ").strip()
                found = provider.tokens.get(token)
                if found is None:
                    self._send(401, {"error": "invalid_token"}, [("WWW-Authenticate", 'Bearer error="invalid_token"')])
                    return
                user, scope = found
                self._send(200, dict(user_info(user, scope)))
            else:
                self._send(404, {"error": "not_found"})

        def do_POST(self) -> None:
            try:
                self._post()
            except Exception:
                self._send(500, {"error": "server_error", "traceback": traceback.format_exc()})

        def _post(self) -> None:
            path = urllib.parse.urlsplit(self.path).path
            request = self._request()
            if path == "/authorize":
                user = provider.users.get(request.form.get("username", ""))
                if user is None or not secrets.compare_digest(user["password"], request.form.get("password", "")):
                    self._send(401, "<!doctype html><p>wrong username or password</p>")
                    return
                params = {k: v for k, v in request.form.items() if k not in ("username", "password")}
                uri = base + "/authorize?" + urllib.parse.urlencode(params)
                authorize = Request("GET", uri, {}, params, {})
                self._send(*provider.create_authorization_response(request=authorize, grant_user=user))
            elif path == "/token":
                self._send(*provider.create_token_response(request))
            elif path == "/test/groups":  # the tests change a person's groups between sign-ins
                with LOCK:
                    provider.users[request.form["username"]]["groups"] = request.form["groups"].split()
                self._send(204, b"")
            else:
                self._send(404, {"error": "not_found"})

    return Handler


def discovery(base: str) -> dict[str, Any]:
    return {
        "issuer": base,
        "authorization_endpoint": base + "/authorize",
        "token_endpoint": base + "/token",
        "userinfo_endpoint": base + "/userinfo",
        "jwks_uri": base + "/jwks",
        "response_types_supported": ["code"],
        "subject_types_supported": ["public"],
        "id_token_signing_alg_values_supported": ["RS256"],
        "code_challenge_methods_supported": ["S256"],
        "token_endpoint_auth_methods_supported": ["client_secret_post"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--config", required=True, help="JSON: client_id, client_secret, redirect_uri, users")
    args = parser.parse_args()
    with open(args.config, encoding="utf-8") as handle:
        config = json.load(handle)
    base = f"http://127.0.0.1:{args.port}"
    client = Client(config["client_id"], config["client_secret"], config["redirect_uri"])
    provider = Provider(base, client, {u["username"]: u for u in config["users"]})
    server = ThreadingHTTPServer(("127.0.0.1", args.port), handler_for(provider, base))
    print(f"OpenID provider on {base}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
