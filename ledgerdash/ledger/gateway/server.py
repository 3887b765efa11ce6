"""The MCP gateway: an MCP server that lists the tools of its upstream MCP
servers as its own and runs every ``tools/call`` through the ledger.

For each call, in the safe order of a side effect (the same steps as
:mod:`ledgerdash.ledger.recording`'s wrapper):

1. name the effect (:mod:`ledgerdash.ledger.gateway.keys`);
2. record the intent under the tenant's current policy (tool and credential
   scope checked there, as on every path); a confirmed key replays its
   recorded result, marked as a replay, without calling the upstream; a key
   that is in flight, unknown or under review is refused with its code;
3. commit DISPATCHED, then send the call upstream, beating the attempt's
   heartbeat while it runs;
4. record the outcome: the upstream's result confirms it (the result is
   stored for replay); an ``isError`` result is the tool's own definitive
   answer (FAILED by default, per tool ``on_error``); a protocol error that
   says the call was refused before running fails it; a call that breaks
   mid-way (the upstream died, the connection dropped, the time ran out)
   leaves it UNKNOWN for the reconciler. Recovery looks it up with the
   ledger tool's adapter: a tool set to a provider preset finds the call by
   what the upstream wrote into it (the gateway sends the upstream the key
   the provider should see, ``_meta["io.ledgerdash/provider_key"]``); a
   tool with no adapter goes to manual review. A streamable HTTP
   upstream that refused the call's connection never received it: that is
   proof nothing was sent, so the attempt fails as retryable (an
   ``upstream_unavailable`` answer), not UNKNOWN.

Upstreams connect on their own: the gateway serves as soon as each has
connected or failed its first try (bounded by ``start_wait``), so one
unreachable upstream never holds the others' tools back; a call to a tool no
connected upstream lists, while some upstream is down, answers
``upstream_unavailable`` naming it. ``tools/list`` leaves out the tools the
tenant's current policy refuses (read at every listing), so an agent is not
offered what the ledger would refuse; a call to one is still refused with
``tool_not_allowed``.

The ledger's steps are synchronous Django code: they run in worker threads,
each committing on its own, never inside a transaction of the caller.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import urlsplit, urlunsplit

import anyio
import anyio.to_thread
import httpx2
import jmespath
import jsonschema
import mcp_types as types
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.server import Server, ServerRequestContext
from mcp.shared.exceptions import MCPError

from ledgerdash.ledger import errors, recording
from ledgerdash.ledger.errors import AttemptBlocked, AttemptInFlight, ClaimLost, LedgerError
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.gateway import checks, keys
from ledgerdash.ledger.gateway.config import GatewayConfig, ToolConfig, UpstreamConfig
from ledgerdash.ledger.models import Attempt, ResultSource, State
from ledgerdash_client import crashpoints

log = logging.getLogger("ledgerdash.gateway")

#: JSON-RPC errors that say the upstream refused the call before running the tool.
REFUSED_BEFORE_RUNNING = {types.METHOD_NOT_FOUND, types.INVALID_PARAMS}
#: How long a call waits for its upstream to (re)connect before giving up, unsent.
CONNECT_WAIT = 30.0
#: An HTTP upstream's timeouts, as the SDK's own client sets them: 30 s to connect or write, 300 s
#: between reads (a server may hold a response stream open); a call's own limit is its tool's.
HTTP_TIMEOUT = httpx2.Timeout(30.0, read=300.0)
#: How long the gateway waits at start for upstreams still connecting (one that
#: failed its first try is not waited for) before it serves the tools it has.
START_WAIT = 10.0


async def in_thread[T](fn: Callable[[], T]) -> T:
    return await anyio.to_thread.run_sync(fn)


class UpstreamUnavailable(Exception):
    pass


class _ConnectWatch(httpx2.AsyncBaseTransport):
    """An HTTP transport that notes which attempts' requests never got a
    connection. httpx raises ``ConnectError``/``ConnectTimeout`` only while
    opening one (TCP, TLS or a proxy), before a byte of the request is
    written: proof the upstream never received it. The request names its
    attempt in ``params._meta`` (the gateway puts it there), so the proof is
    the call's own even when other calls share the connection pool."""

    def __init__(self, unsent: dict[int, str]) -> None:
        self.unsent = unsent
        self.inner = httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        try:
            return await self.inner.handle_async_request(request)
        except (httpx2.ConnectError, httpx2.ConnectTimeout) as exc:
            attempt_id = _attempt_named_in(request)
            if attempt_id is not None:
                self.unsent[attempt_id] = _describe(exc)
            raise

    async def aclose(self) -> None:
        await self.inner.aclose()


def _without_credentials(url: str) -> str:
    """``url`` as the log and the answers may show it: no user or password in it."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host  # an IPv6 address keeps its brackets
    return urlunsplit(parts._replace(netloc=host + (f":{parts.port}" if parts.port else "")))


def _attempt_named_in(request: httpx2.Request) -> int | None:
    try:
        message = json.loads(request.content)
        found = message["params"]["_meta"][keys.META_ATTEMPT]
    except (ValueError, TypeError, KeyError, httpx2.RequestNotRead):
        return None
    return found if isinstance(found, int) and not isinstance(found, bool) else None


class Upstream:
    """One upstream MCP server, connected by a task of its own that reconnects
    when the connection breaks (an anyio connection must be closed by the task
    that opened it, so calls only borrow it)."""

    def __init__(self, config: UpstreamConfig) -> None:
        self.config = config
        self.client: Client | None = None
        self.tools: list[types.Tool] = []
        #: Why the last try to connect failed ("" while connected or not tried yet).
        self.failure = ""
        #: Attempts whose request the upstream certainly never received, and why.
        self.unsent: dict[int, str] = {}
        self._ready = anyio.Event()
        self._tried = anyio.Event()
        self._broken = anyio.Event()
        self._closing = False

    @property
    def where(self) -> str:
        """The upstream's name and address, as the log and the answers give them."""
        return f"{self.config.name} ({_without_credentials(self.config.url) or ' '.join(self.config.command)})"

    def _target(self, stack: AsyncExitStack) -> Any:
        if self.config.command:
            return StdioServerParameters(
                command=self.config.command[0],
                args=list(self.config.command[1:]),
                env=self.config.env or None,
                cwd=self.config.cwd or None,
            )
        http = httpx2.AsyncClient(
            timeout=HTTP_TIMEOUT,
            transport=_ConnectWatch(self.unsent),
        )
        stack.push_async_callback(http.aclose)
        return streamable_http_client(self.config.url, http_client=http)

    async def run(self) -> None:
        delay = 0.2
        while not self._closing:
            connected = False
            try:
                async with AsyncExitStack() as stack:
                    client = await stack.enter_async_context(Client(self._target(stack), cache=None))
                    self.tools = await _all_tools(client)
                    self.client = client
                    self.failure = ""
                    connected = True
                    self._ready.set()
                    self._tried.set()
                    delay = 0.2
                    log.info("upstream %s: connected, %d tools", self.where, len(self.tools))
                    await self._broken.wait()
            except Exception as exc:
                if connected:
                    log.warning("upstream %s: connection ended: %s", self.where, _describe(exc))
                else:
                    self.failure = _describe(exc)
                    log.warning(
                        "upstream %s: could not connect: %s; trying again in %g s", self.where, self.failure, delay
                    )
            self.client = None
            self._tried.set()
            self._ready = anyio.Event()
            self._broken = anyio.Event()
            if not self._closing:
                await anyio.sleep(delay)
                delay = min(delay * 2, 5.0)

    def broken(self) -> None:
        """A call saw the connection fail: reconnect before the next call."""
        self.client = None
        self._broken.set()

    def close(self) -> None:
        self._closing = True
        self._broken.set()

    async def connected(self, timeout: float = CONNECT_WAIT) -> Client:
        with anyio.move_on_after(timeout):
            while True:
                await self._ready.wait()
                if self.client is not None:
                    return self.client
                await anyio.sleep(0.05)
        why = f": {self.failure}" if self.failure else ""
        raise UpstreamUnavailable(f"the upstream MCP server {self.where} is not connected{why}")


async def _all_tools(client: Client) -> list[types.Tool]:
    tools: list[types.Tool] = []
    cursor: str | None = None
    for _ in range(100):
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            break
    return tools


@dataclass(frozen=True)
class Route:
    upstream: Upstream
    upstream_name: str
    tool: types.Tool


def _error(message: str, *, code: str, attempt: errors.Attempt | None = None) -> types.CallToolResult:
    detail: dict[str, Any] = {"code": code, "message": message}
    if attempt is not None:
        detail.update(attempt_id=attempt.pk, state=attempt.state)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=f"ledger: {code}: {message}")],
        is_error=True,
        _meta={keys.META_ERROR: detail},
    )


def _refusal(exc: LedgerError) -> types.CallToolResult:
    return _error(str(exc), code=exc.code, attempt=exc.attempt if isinstance(exc, AttemptBlocked) else None)


def _with_meta(result: types.CallToolResult, extra: dict[str, Any]) -> types.CallToolResult:
    return result.model_copy(update={"meta": {**(result.meta or {}), **extra}})


class Gateway:
    def __init__(self, config: GatewayConfig, *, agent: str = "mcp-gateway") -> None:
        self.config = config
        self.actor = Actor.agent(agent)
        self.upstreams = [Upstream(u) for u in config.upstreams]

    # --- what the gateway lists ---------------------------------------------------

    def routes(self) -> dict[str, Route]:
        routes: dict[str, Route] = {}
        for upstream in self.upstreams:
            for tool in upstream.tools:
                name = upstream.config.prefix + tool.name
                if name in routes:
                    log.warning("tool %s of %s hides the one of %s", name, upstream.config.name, routes[name])
                    continue
                routes[name] = Route(upstream, tool.name, tool.model_copy(update={"name": name}))
        return routes

    async def list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        routes = self.routes()
        refused = await in_thread(
            lambda: checks.refused_tools(self.config, {name: self.config.tool(name) for name in routes})
        )
        return types.ListToolsResult(tools=[route.tool for name, route in routes.items() if name not in refused])

    # --- one call -------------------------------------------------------------------

    async def call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        name = params.name
        route = self.routes().get(name)
        if route is None:
            down = [u.where for u in self.upstreams if u.client is None]
            if down:
                # Its upstream may be one that is down: say so, rather than "unknown tool".
                return _error(
                    f"no connected upstream lists the tool {name!r}; not connected: {', '.join(down)}; "
                    f"nothing was recorded or sent",
                    code="upstream_unavailable",
                )
            raise MCPError(types.INVALID_PARAMS, f"unknown tool {name!r}")
        arguments = dict(params.arguments or {})
        settings = self.config.tool(name)
        wrong = _schema_problem(route.tool.input_schema, arguments)
        if wrong:
            # Refused before anything is recorded: a call the upstream can only reject would be recorded as
            # FAILED under its key, and the corrected call then refused as the key reused with other arguments.
            return _error(
                f"the arguments do not match {name}'s input schema: {wrong}; nothing was recorded or sent",
                code="invalid_args",
            )
        try:
            prepared = await self._prepare(name, arguments, params.meta, settings)
        except LedgerError as exc:
            return _refusal(exc)
        if isinstance(prepared, types.CallToolResult):
            return prepared
        return await self._dispatch(route, prepared, arguments, settings)

    async def _prepare(
        self, name: str, arguments: dict[str, Any], meta: Any, settings: ToolConfig
    ) -> Attempt | types.CallToolResult:
        """Record the intent and claim the dispatch; or the replayed result, or a refusal."""
        call = keys.derive(
            tool=name, arguments=arguments, meta=meta, settings=settings, default_task=self.config.task_id
        )
        attempt = await in_thread(
            lambda: (
                recording.record_intent(
                    tenant=self.config.tenant,
                    task_id=call.task_id,
                    tool_name=settings.ledger_tool or name,
                    idempotency_key=call.key,
                    args=arguments,
                    credential_scope=settings.scope,
                    actor=self.actor,
                ).attempt
            )
        )
        if attempt.state == State.OUTCOME_CONFIRMED:
            return self._replay(attempt)
        await in_thread(lambda: recording.refuse_unless_dispatchable(attempt))
        crashpoints.reached(crashpoints.AFTER_INTENT)
        route = self.routes().get(name)
        if route is not None:
            try:
                await route.upstream.connected()
            except UpstreamUnavailable as exc:
                return _error(f"{exc}; nothing was sent", code="upstream_unavailable", attempt=attempt)
        try:
            return await in_thread(lambda: recording.mark_dispatched(attempt, actor=self.actor))
        except ClaimLost:
            raise AttemptInFlight(
                AttemptInFlight.MESSAGE.format(attempt_id=attempt.pk, holder="another worker"), attempt
            ) from None

    def _replay(self, attempt: Attempt) -> types.CallToolResult:
        try:
            stored = recording.replay(attempt)
            result = types.CallToolResult.model_validate(stored)
        except LedgerError as exc:
            return _refusal(exc)
        except ValueError:
            if attempt.result_source == ResultSource.LOOKUP:
                # Recovery confirmed it by asking the provider: what the provider
                # said is the result (the tool's own answer was never recorded).
                log.info(
                    "replaying attempt %s (key %s) from the provider's lookup", attempt.pk, attempt.idempotency_key
                )
                text = json.dumps(stored, ensure_ascii=False, sort_keys=True)
                recovered = types.CallToolResult(
                    content=[types.TextContent(type="text", text=text)],
                    structured_content=stored if isinstance(stored, dict) else None,
                )
                return _with_meta(
                    recovered, {keys.META_REPLAYED: True, keys.META_ATTEMPT: attempt.pk, keys.META_RECOVERED: True}
                )
            return _error(
                f"attempt {attempt.pk} was confirmed, but its recorded result is not an MCP tool result",
                code="result_unavailable",
                attempt=attempt,
            )
        log.info("replaying attempt %s (key %s)", attempt.pk, attempt.idempotency_key)
        return _with_meta(result, {keys.META_REPLAYED: True, keys.META_ATTEMPT: attempt.pk})

    async def _dispatch(
        self, route: Route, attempt: Attempt, arguments: dict[str, Any], settings: ToolConfig
    ) -> types.CallToolResult:
        crashpoints.reached(crashpoints.BEFORE_SEND)
        fence = attempt.fence
        limit = await in_thread(lambda: checks.max_request_seconds(attempt.tool_name))
        timeout = checks.timeout_for(settings, limit)
        try:
            client = await route.upstream.connected(timeout=1.0)
            async with anyio.create_task_group() as beats:
                beats.start_soon(self._heartbeat, attempt, fence)
                try:
                    with anyio.fail_after(timeout):
                        result = await client.call_tool(
                            route.upstream_name,
                            arguments,
                            read_timeout_seconds=None,
                            meta=cast(
                                types.RequestParamsMeta,
                                {keys.META_ATTEMPT: attempt.pk, keys.META_PROVIDER_KEY: attempt.provider_key},
                            ),
                        )
                finally:
                    beats.cancel_scope.cancel()
        except MCPError as exc:
            if unsent := route.upstream.unsent.pop(attempt.pk, ""):
                return await self._not_sent(route, attempt, unsent)
            if exc.code in REFUSED_BEFORE_RUNNING:
                reason = f"the upstream refused the call before running it: {exc.message}"
                await self._report(attempt, lambda: recording.fail(attempt, fence=fence, reason=reason))
                return _error(reason, code="upstream_refused", attempt=attempt)
            route.upstream.broken()
            return await self._lost(route, attempt, f"the upstream answered with error {exc.code}: {exc.message}")
        except Exception as exc:  # the connection broke, the process died, the time ran out
            if unsent := route.upstream.unsent.pop(attempt.pk, ""):
                return await self._not_sent(route, attempt, unsent)
            route.upstream.broken()
            cause = _cause(exc)
            if isinstance(cause, TimeoutError):
                why = f"no answer from the upstream within {timeout:g} s (the tool's maximum request time or less)"
            else:
                why = f"the upstream call broke mid-way: {type(cause).__name__}: {cause}"
            return await self._lost(route, attempt, why)
        route.upstream.unsent.pop(attempt.pk, None)
        crashpoints.reached(crashpoints.AFTER_RESPONSE)
        return await self._settle(route, attempt, fence, result, settings)

    async def _not_sent(self, route: Route, attempt: Attempt, why: str) -> types.CallToolResult:
        """The upstream never received the call: it failed, retryable, and the same call may be made again."""
        route.upstream.broken()
        reason = f"the upstream MCP server {route.upstream.where} could not be reached: {why}; nothing was sent"
        await self._report(attempt, lambda: recording.fail_retryable(attempt, fence=attempt.fence, reason=reason))
        return _error(reason, code="upstream_unavailable", attempt=attempt)

    async def _lost(self, route: Route, attempt: Attempt, reason: str) -> types.CallToolResult:
        reason = reason[:1000]
        await self._report(attempt, lambda: recording.mark_unknown(attempt, fence=attempt.fence, reason=reason))
        return _error(
            f"{reason}; the outcome is unknown and recovery will settle it: do not call again",
            code="outcome_unknown",
            attempt=attempt,
        )

    async def _settle(
        self, route: Route, attempt: Attempt, fence: int, result: types.CallToolResult, settings: ToolConfig
    ) -> types.CallToolResult:
        dumped = result.model_dump(mode="json", by_alias=True, exclude_none=True)
        meta = {keys.META_ATTEMPT: attempt.pk}
        if result.is_error:
            text = " ".join(c.text for c in result.content if isinstance(c, types.TextContent))[:500]
            reason = f"the tool answered with an error: {text or 'no text'}"
            if settings.on_error == "unknown":
                step = lambda: recording.mark_unknown(attempt, fence=fence, reason=reason)  # noqa: E731
            elif settings.on_error == "failed_retryable":
                step = lambda: recording.fail_retryable(attempt, fence=fence, reason=reason)  # noqa: E731
            else:
                step = lambda: recording.fail(attempt, fence=fence, reason=reason)  # noqa: E731
            await self._report(attempt, step)
            return _with_meta(result, meta)
        request_id = ""
        if settings.request_id:
            found = jmespath.search(settings.request_id, dumped)
            if isinstance(found, str | int) and not isinstance(found, bool):
                request_id = str(found)
        stored, note = _storable(dumped)
        await self._report(
            attempt,
            lambda: recording.report_outcome(
                attempt,
                outcome="confirmed",
                fence=fence,
                provider_request_id=request_id,
                result_ref=f"mcp://{route.upstream.config.name}/{route.upstream_name}",
                result=stored,
                result_source="tool" if not note else "",
                actor=self.actor,
            ),
        )
        return _with_meta(result, meta)

    async def _report(self, attempt: Attempt, step: Callable[[], Any]) -> None:
        # The upstream's answer matters more than a failed report: an
        # unreported outcome is found by the reconciler when the lease runs out.
        try:
            await in_thread(step)
        except Exception:
            log.exception("could not record the outcome of attempt %s; the reconciler will settle it", attempt.pk)

    async def _heartbeat(self, attempt: Attempt, fence: int) -> None:
        if attempt.next_check_at is None:
            return
        interval = max(0.05, (attempt.next_check_at - attempt.updated_at).total_seconds() / 3)
        while True:
            await anyio.sleep(interval)
            try:
                await in_thread(lambda: recording.heartbeat(attempt, fence=fence, actor=self.actor))
            except LedgerError as exc:
                if exc.code in ("stale_fence", "claim_lost"):
                    return
                log.warning("attempt %s: heartbeat failed: %s", attempt.pk, exc)

    # --- running --------------------------------------------------------------------

    def server(self) -> Server[Any]:
        return Server(
            "ledgerdash-gateway",
            instructions=(
                "Tools of the configured upstream MCP servers; every call is recorded in the ledgerdash "
                "ledger and a repeated call replays its recorded result (marked io.ledgerdash/replayed)."
            ),
            on_list_tools=self.list_tools,
            on_call_tool=self.call_tool,
        )

    async def serve(self, run: Callable[[Server[Any]], Awaitable[None]], *, start_wait: float = START_WAIT) -> None:
        """Connect the upstreams, wait until each has connected or failed its
        first try (at most ``start_wait`` seconds), then serve with ``run``
        until it returns; an upstream that is not connected yet keeps trying
        and its tools are listed once it is."""
        async with anyio.create_task_group() as group, AsyncExitStack():
            for upstream in self.upstreams:
                group.start_soon(upstream.run)
            with anyio.move_on_after(start_wait):
                for upstream in self.upstreams:
                    await upstream._tried.wait()
            for upstream in self.upstreams:
                if upstream.client is None:
                    why = upstream.failure or f"still connecting after {start_wait:g} s"
                    log.warning(
                        "upstream %s: not connected (%s); serving the others, its tools are listed once it is",
                        upstream.where,
                        why,
                    )
            try:
                await run(self.server())
            finally:
                for upstream in self.upstreams:
                    upstream.close()
                group.cancel_scope.cancel()


def _schema_problem(schema: dict[str, Any] | None, arguments: dict[str, Any]) -> str:
    """What in ``arguments`` the tool's input schema refuses (the most relevant error), or ""."""
    if not schema:
        return ""
    try:
        validator_class = jsonschema.validators.validator_for(schema)
        validator_class.check_schema(schema)
    except jsonschema.SchemaError:
        log.warning("a tool's input schema is not a valid JSON schema; its calls are not checked against it")
        return ""
    error = jsonschema.exceptions.best_match(validator_class(schema).iter_errors(arguments))
    if error is None:
        return ""
    where = ".".join(str(part) for part in error.absolute_path)
    return f"{where}: {error.message}" if where else error.message


def _cause(exc: BaseException) -> BaseException:
    """What went wrong, out of the task groups that wrap it."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _describe(exc: BaseException) -> str:
    """A failure in words an operator acts on: "connection refused" when it
    was, else the deepest cause (a library's own wrapper says less)."""
    seen: list[BaseException] = []
    current: BaseException | None = _cause(exc)
    while current is not None and current not in seen and len(seen) < 20:
        seen.append(current)
        if isinstance(current, ConnectionRefusedError):
            return "connection refused"
        if isinstance(current, httpx2.ConnectError):  # it keeps no OSError to say which
            return f"connection refused or unreachable ({current})"
        if isinstance(current, httpx2.ConnectTimeout):
            return f"no connection within the connect timeout ({current})"
        current = _cause(current.__cause__) if current.__cause__ is not None else None
    deepest = seen[-1]
    return f"{type(deepest).__name__}: {deepest}" if str(deepest) else type(deepest).__name__


def _storable(value: Any) -> tuple[Any, str]:
    from ledgerdash_client.toolcalls import storable_json

    return storable_json(value)
