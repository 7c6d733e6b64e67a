"""The HTTP server around the app: its two listeners, and the drain on SIGTERM.

Listeners. The public API listens on `[server] host:port`; the operator endpoints (`/metrics`,
`/v1/internal/...`) answer only on `[server] ops_host:ops_port` (loopback by default), so the load
balancer's port never exposes them, and the public API never answers there (which route answers on
which: edge/routes/listeners.py). One uvicorn server
holds both sockets: one event loop, one app, one lifespan. Under `serve --workers` the public port
is the workers' (SO_REUSEPORT): a worker listens on it only once it may take work, not while it
joins the fleet with no share yet of the replicas the edges share (its ops listener at once).

Signals. uvicorn stops listening at once on SIGTERM and then cancels whatever still runs, which
cut streams with a bare TCP close. Here SIGTERM begins a drain (edge/drain.py) instead: `/readyz`
fails and new generations get 503 while the listeners keep accepting for `drain_accept_s`; then
uvicorn's own shutdown runs, waiting for the streams, which the drain ends by `drain_deadline_s`.
The public listener closes then; the operator listener answers until the streams have ended, just
before the app's shutdown (DrainingServer's `ops`): a liveness probe or a scrape of the ops port
meanwhile is answered (`/healthz` 200, `/readyz` 503 `draining`, `/metrics`), not refused, so no
orchestrator takes the edge for dead mid-drain. The process exits 0. SIGHUP (a closed terminal)
drains as SIGTERM does, unless ignored (nohup).
SIGINT (Ctrl-C), or a second SIGTERM, cuts the streams at once (each still ends with its usage, an
error event and `[DONE]`) and exits 0; one more stops waiting for connections still open. Either
way the app's shutdown runs, and with it the usage writer (DrainingServer.handle_exit).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from email.utils import formatdate
from types import FrameType
from typing import cast

import structlog
import uvicorn
from litestar import Litestar
from uvicorn._types import ASGI3Application, ASGIReceiveCallable, ASGISendCallable, Scope
from uvicorn.lifespan.off import LifespanOff
from uvicorn.lifespan.on import LifespanOn
from uvicorn.server import ServerState

from edge.config import ServerConfig
from edge.drain import Drain
from edge.http_protocol import EdgeHttpProtocol, edge_http_protocol, operator_protocol
from edge.routes.health import joining

log = structlog.get_logger("floodgate.server")

# After the drain deadline, how long the cut streams get to write their last events and close
# (a client that stopped reading holds its connection this long). A part of the 5 s a deployment
# leaves between the deadline and SIGKILL (docs/deploy.md, Graceful drain): the app's shutdown, which
# writes the cut streams' usage rows, runs after it. At 5 s it took the whole margin, and a stopped
# reader's edge was killed during that shutdown (exit measured at deadline + 5.7 s).
SHUTDOWN_GRACE_S = 2.0
# Past the drain's cut, how long a connection may hold unsent bytes its client takes none of before
# it is aborted (DrainingServer._abort_unsent): the cut streams' last events wait on nobody longer.
CUT_UNSENT_S = 1.0
# How long a request on the operator listener (a probe, a scrape: milliseconds) may still run once
# the streams have ended, before its connection is cut, its task cancelled and the app's shutdown
# begins. Short: it comes out of the same margin before SIGKILL as SHUTDOWN_GRACE_S. The cancelled
# ones get as long again to end (one in a thread call ends only when that call returns).
OPS_CLOSE_GRACE_S = 0.5


@dataclass(frozen=True, slots=True)
class Listeners:
    public: socket.socket
    ops: socket.socket

    @property
    def ops_port(self) -> int:
        return int(self.ops.getsockname()[1])

    def close(self) -> None:
        self.public.close()
        self.ops.close()


def bind_listeners(server: ServerConfig, *, reuse_port: bool = False) -> Listeners:
    """Bind (not yet listen on) both sockets; port 0 picks a free one (tests). `reuse_port`: the
    public one is shared with the other workers of `floodgate serve --workers` (edge/workers.py)."""
    public = _bind(server.host, server.port, reuse_port=reuse_port)
    if server.send_buffer_bytes:
        # Accepted connections inherit it: what one stalled client can pin in the kernel.
        public.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, server.send_buffer_bytes)
    try:
        ops = _bind(server.ops_host, server.ops_port)
    except OSError:
        public.close()
        raise
    return Listeners(public, ops)


def refuse_a_taken_port(host: str, port: int) -> None:
    """OSError (EADDRINUSE) when something listens on `host:port` already. The workers of `serve
    --workers` bind it with SO_REUSEPORT, which any process of the same account that bound it so
    too (another edge's workers) shares without a word: their parent asks first, binding it as a
    lone `serve` does, and lets it go at once."""
    _bind(host, port).close()


def refuse_taken_ports(addresses: Iterable[tuple[str, int, str]]) -> None:
    """SystemExit naming the first of `addresses` (host, port, what it is for) that cannot be bound:
    something listens on it already, or the host is no address of this machine (a typo). `serve`
    asks before the model's import and the dev key: found only at the bind, a refused serve had
    printed "Try it: curl ..." with a key for an edge that never started. Port 0 is bound too (the
    kernel picks a free port, let go at once): skipped, `--host <typo> --port 0` got that far."""
    for host, port, what in addresses:
        try:
            refuse_a_taken_port(host, port)
        except OSError as exc:
            named = f" ({what})" if what else ""
            raise SystemExit(f"floodgate: cannot listen on {host}:{port}{named}: {exc.strerror}") from None


def _address(sock: socket.socket) -> str:
    """`host:port` a bound socket listens on (`[host]:port` for IPv6)."""
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _bind(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def uvicorn_config(
    app: Litestar, server: ServerConfig, *, max_connections: int | None = None, **overrides: object
) -> uvicorn.Config:
    """The uvicorn settings every way of running the edge shares (`floodgate serve`, the tests, the
    benches' servers, some of which wrap the app or serve one of their own). `max_connections`: the
    app's connection cap (create_app's `app.state.max_connections`), None for none."""
    options: dict[str, object] = {
        "loop": "uvloop",
        # uvicorn's httptools protocol, with fewer writes and a shorter path per token.
        # Past the connection cap, a new connection is answered 503 and closed.
        "http": edge_http_protocol(
            server.header_timeout_s, server.cors_allow_origins, max_connections, server.idle_reclaim_after_s
        ),
        "log_level": "warning",
        # uvicorn's access lines are info, below that level: none was ever written. Off, a response
        # also skips formatting the client address and quoting the path for the filtered call.
        "access_log": False,
        # No WebSocket routes: an upgrade request is plain HTTP (answered like any other). Handed
        # to uvicorn's WebSocket protocol it took the connection from under a request still running
        # there, which then generated its whole reply for no one (a review).
        "ws": "none",
        # The kernel caps it at net.core.somaxconn: raise that too where many clients connect at once.
        "backlog": server.listen_backlog,
        # uvicorn's own 5 s is far below any load balancer's idle timeout (ALB: 60 s by default).
        "timeout_keep_alive": server.http_keep_alive_s,
        # Only reached after the drain deadline has already ended every stream (see module doc).
        "timeout_graceful_shutdown": max(0.0, server.drain_deadline_s - server.drain_accept_s)
        + SHUTDOWN_GRACE_S,
    }
    options.update(overrides)
    return uvicorn.Config(app, **options)  # type: ignore[arg-type]


def _terminals() -> tuple[int, ...]:
    """Which of standard output and error are a terminal (asked at start: a terminal that hung up
    answers no)."""
    return tuple(fd for fd in (1, 2) if os.isatty(fd))


def _leave_the_terminal(fds: tuple[int, ...]) -> None:
    """Standard output and error away from a terminal that hung up: the drain's first log line
    written to it failed (EIO), the main loop died with it, exit 1, and the streams were neither
    cut nor billed. Only those that are no terminal any more (hung up): a `kill -HUP` with the
    terminal still open keeps the drain's log lines on it."""
    gone = [fd for fd in fds if not os.isatty(fd)]
    if not gone:
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in gone:
            os.dup2(null, fd)
    finally:
        os.close(null)


class _AfterTheRequests:
    """uvicorn's lifespan, whose shutdown (the app's) begins once the requests still running have
    ended, or after SHUTDOWN_GRACE_S: those uvicorn has just cancelled settle, log and record their
    usage on the app's limiter, stores and writers. `before` runs then, first (the operator
    listener closes: nothing reaches the app once its shutdown began)."""

    def __init__(
        self,
        lifespan: LifespanOn | LifespanOff,
        tasks: set[asyncio.Task[None]],
        before: Callable[[], Awaitable[None]],
    ) -> None:
        self._lifespan = lifespan
        self._tasks = tasks
        self._before = before

    async def shutdown(self) -> None:
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=SHUTDOWN_GRACE_S)
        await self._before()
        await self._lifespan.shutdown()


class DrainingServer(uvicorn.Server):
    """uvicorn's server with SIGTERM turned into a drain. The signal handler only sets flags: the
    drain itself begins on the loop, at uvicorn's next tick (every 0.1 s).

    `held`: a bound socket not passed to run(), listened on at the first tick at which
    `may_take_work()` is true (never once the drain began).

    `ops`: the operator listener's bound socket, not passed to run() either. uvicorn's shutdown
    closes every listener it holds when the accept window ends, and with this one the probes and
    the scrapes of a draining edge met a refused connection for the rest of its drain (up to
    `drain_deadline_s`): a liveness probe's orchestrator killed it mid-drain, cutting the streams
    the drain was keeping, and the drain's last metrics were lost. So it is this server's own, and
    closes only once the streams have ended, as the app's shutdown begins (`_close_ops`). Its
    connections are counted apart from uvicorn's (`_ops_state`): uvicorn's shutdown waits for
    every connection it counts to close, and a scraper's keep-alive connection opened during the
    drain would have held the exit until its keep-alive timeout."""

    def __init__(
        self,
        config: uvicorn.Config,
        drain: Drain,
        *,
        held: socket.socket | None = None,
        ops: socket.socket | None = None,
        may_take_work: Callable[[], bool] = lambda: True,
        public: str = "",
    ) -> None:
        super().__init__(config)
        self.drain = drain
        self._ops = ops
        self._ops_server: asyncio.Server | None = None
        self._ops_state = ServerState()
        self._ops_dates: asyncio.Task[None] | None = None
        self._ops_cut = False
        self._public = public
        self._drain_requested = False
        self._cut_requested = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._held = held
        self._may_take_work = may_take_work
        self._terminals = _terminals()
        self._unsent_watch: asyncio.Task[None] | None = None
        drain.on_cut(self._watch_unsent)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """SIGTERM (and SIGHUP, a closed terminal) drains; Ctrl-C, or a second SIGTERM, ends the
        streams now (with their usage and final events), then exits 0; one more stops waiting for
        connections still open, and the app's shutdown still runs (`shutdown`). A SIGHUP after the
        first signal changes nothing.

        Never uvicorn's own: it records each signal to re-raise at exit (exit 143, or a
        KeyboardInterrupt traceback for Ctrl-C), and a second Ctrl-C is its force exit, which skips
        the app's shutdown and with it the usage rows of the streams just cut (a `--workers` edge's
        parent passes each of its signals on to every worker)."""
        first = not (self._drain_requested or self.should_exit)
        if sig == signal.SIGHUP:
            _leave_the_terminal(self._terminals)
        if sig in (signal.SIGTERM, signal.SIGHUP) and first:
            self._drain_requested = True
            return
        if sig == signal.SIGHUP:
            # A closed terminal's shell and then its kernel each send one, a millisecond apart:
            # the second cut the streams the first was draining.
            return
        if self._cut_requested:
            # A client stalled mid-body held the exit until its body timeout, and nothing but a
            # SIGKILL could end the wait.
            self.force_exit = True
            return
        self._drain_requested = True
        self._cut_requested = True
        if self.should_exit and self._loop is not None:
            # Past the accept window uvicorn's main loop has ended and waits for the streams: no
            # tick reads the flag any more, so a second SIGTERM left them to the drain deadline.
            self._loop.call_soon_threadsafe(self.drain.cut)
        self.should_exit = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # uvicorn cancels the requests still running past its graceful timeout and runs the app's
        # shutdown at once, beside them: a cut stream whose replica took a while to abort (its
        # close comes first) recorded its usage after the usage writer had closed, and the row was
        # dropped, though the client's usage chunk said it was charged. The app's shutdown now
        # waits for them, as a forced exit's does (below).
        lifespan = self.lifespan
        self.lifespan = _AfterTheRequests(lifespan, self.server_state.tasks, self._close_ops)
        try:
            await super().shutdown(sockets)
        finally:
            self.lifespan = lifespan
            if self._unsent_watch is not None:
                self._unsent_watch.cancel()
        if not self.force_exit:
            return
        # Forced: hang up on the connections still open, so their requests end as at a client's
        # hang-up (left to the loop's end, each was cancelled and logged a traceback), then run the
        # app's shutdown, which uvicorn skips on a forced exit: the usage writer flushes there.
        # Aborted, not closed: a close waits for the write buffer to drain, which a client that
        # stopped reading never lets happen.
        for connection in list(self.server_state.connections):
            transport = getattr(connection, "transport", None)
            if transport is not None:
                transport.abort()
        if self.server_state.tasks:
            await asyncio.wait(self.server_state.tasks, timeout=SHUTDOWN_GRACE_S)
        await self._close_ops()
        await self.lifespan.shutdown()

    def _watch_unsent(self) -> None:
        """At the drain's cut (on the loop): from now on abort every connection whose unsent bytes
        the client has not taken for CUT_UNSENT_S (`_abort_unsent`)."""
        if self._unsent_watch is None:
            self._unsent_watch = asyncio.get_running_loop().create_task(
                self._abort_unsent(), name="abort-unsent-after-cut"
            )

    async def _abort_unsent(self) -> None:
        """A stream cut whose client stopped reading either waits to write its last events (the
        connection's buffer full) or has written them into that buffer, its request done, and
        uvicorn's shutdown then closes the idle connection, a close that waits for the buffer to
        drain. Either way such a client held the exit until uvicorn's graceful timeout, the drain
        deadline (a forced cut's exit came 63 s late with drain_deadline_s 60). After the cut a
        connection holding unsent bytes that the client took none of for CUT_UNSENT_S is aborted,
        which also ends a write still waiting; a client still reading, however slowly, is not."""
        unsent: dict[object, int] = {}
        while True:
            await asyncio.sleep(CUT_UNSENT_S)
            for connection in list(self.server_state.connections):
                transport = getattr(connection, "transport", None)
                if transport is None:
                    continue
                size = transport.get_write_buffer_size()
                if size and unsent.get(connection) == size:
                    transport.abort()
                unsent[connection] = size

    async def _close_ops(self) -> None:
        """Stop the operator listener (idempotent): its requests still running get
        OPS_CLOSE_GRACE_S, then every connection of its own is cut and their tasks cancelled.

        Cancelled, not only cut off: a request still running (an admin call held up by its key
        store) ran on into the app's shutdown, on the key store, limiter and writers it closes,
        and ended on a closed store or, still running at the loop's end, in uvicorn's "Exception in
        ASGI application" traceback. As uvicorn does for its own requests at its shutdown."""
        server, self._ops_server = self._ops_server, None
        if server is None:
            return
        server.close()
        if self._ops_dates is not None:
            self._ops_dates.cancel()
        state = self._ops_state
        for connection in list(state.connections):
            connection.shutdown()  # an idle one closes now, a busy one after its response
        if state.tasks:
            await asyncio.wait(set(state.tasks), timeout=OPS_CLOSE_GRACE_S)
        for connection in list(state.connections):
            transport = getattr(connection, "transport", None)
            if transport is not None:
                transport.abort()
        if state.tasks:
            self._ops_cut = True
            for task in state.tasks:
                task.cancel(msg="the operator listener closed")
            await asyncio.wait(set(state.tasks), timeout=OPS_CLOSE_GRACE_S)

    def _ops_app(self, app: ASGI3Application) -> ASGI3Application:
        """`app` as the operator listener runs it: a request `_close_ops` cancelled ends with a log
        line, its connection already cut. Left to uvicorn, the cancellation was logged as an
        "Exception in ASGI application" traceback, at every exit that cut one."""

        async def ops_app(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
            try:
                await app(scope, receive, send)
            except asyncio.CancelledError:
                if not self._ops_cut:
                    raise
                log.warning("ops_request_cut_by_shutdown", path=scope.get("path"), grace_s=OPS_CLOSE_GRACE_S)

        return ops_app

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's (SIGINT, SIGTERM), and SIGHUP: a terminal closing under `floodgate serve` killed
        it outright, its streams reset without an error event. Not where SIGHUP is ignored
        (`nohup floodgate serve`): that edge must serve on."""
        with super().capture_signals():
            if (
                threading.current_thread() is not threading.main_thread()
                or signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            ):
                yield
                return
            previous = signal.signal(signal.SIGHUP, self.handle_exit)
            try:
                yield
            finally:
                signal.signal(signal.SIGHUP, previous)

    def request_drain(self) -> None:
        """What SIGTERM does, for a server running in a thread (tests), where signals cannot reach."""
        self._drain_requested = True

    async def on_tick(self, counter: int) -> bool:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        drain = self.drain
        if self._drain_requested and not drain.draining:
            drain.begin()
        if self._cut_requested:
            drain.cut()
        if drain.draining and not self.should_exit and drain.accept_left_s() == 0.0:
            self.should_exit = True  # the listeners close now; uvicorn waits for the streams
        if self._held is not None and not drain.draining and self._may_take_work():
            sock, self._held = self._held, None
            await self._listen(sock, self.server_state)
            self._serving()
        return await super().on_tick(counter)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)  # exits where the app's start-up failed
        if self._ops is not None:
            sock, self._ops = self._ops, None
            self._ops_server = await self._listen(sock, self._ops_state, own=True)
            self._ops_dates = asyncio.create_task(self._date_ops(), name="ops-date-header")
        if self._held is None:
            self._serving()

    async def _date_ops(self) -> None:
        """The operator listener's default headers (Date, Server), refreshed each second until it
        closes (`_close_ops` cancels this). Not uvicorn's: it refreshes them at its ticks, which end
        with the accept window, and the operator listener's probes and scrapes answered through the
        rest of the drain (up to drain_deadline_s) carried the Date of that moment, frozen."""
        config = self.config
        while True:
            date = [(b"date", formatdate(time.time(), usegmt=True).encode())] if config.date_header else []
            self._ops_state.default_headers = date + config.encoded_headers
            await asyncio.sleep(1.0)

    def _serving(self) -> None:
        """`edge_serving`: the public port accepts from now on. `edge_listening` comes as the ports
        are bound, before the app's start-up (the engines load, seconds with a real model), and a
        client that took it, or the dev key's `curl`, for the go-ahead met a refused connection."""
        log.info("edge_serving", public=self._public)

    async def _listen(self, sock: socket.socket, state: ServerState, *, own: bool = False) -> asyncio.Server:
        """Accept on `sock` from now on, as uvicorn's startup does on the sockets run() was given,
        its connections and requests counted in `state`. uvicorn's shutdown closes every server in
        `self.servers`: one `own` is left out of them (closed by this class, `_close_ops`), and its
        requests run through `_ops_app`."""
        config = self.config
        # Read now: the shutdown puts a wrapper in `self.lifespan` (_AfterTheRequests) while the
        # operator listener still accepts.
        app_state = self.lifespan.state

        ops_app = self._ops_app(config.loaded_app) if own else None
        # The operator listener's connections are its own to cap and to close when idle.
        public = config.http_protocol_class  # uvicorn_config's: edge_http_protocol
        protocol_class = operator_protocol(cast(type[EdgeHttpProtocol], public)) if own else public

        def protocol() -> asyncio.Protocol:
            made = protocol_class(  # type: ignore[call-arg]
                config=config, server_state=state, app_state=app_state
            )
            if ops_app is not None:
                made.app = ops_app  # type: ignore[attr-defined]  # uvicorn's protocols all read it
            return made

        loop = asyncio.get_running_loop()
        server = await loop.create_server(protocol, sock=sock, ssl=config.ssl, backlog=config.backlog)
        if not own:
            self.servers.append(server)
        return server


def serve(app: Litestar, server: ServerConfig, drain: Drain, *, reuse_port: bool = False) -> None:
    """Run the edge until SIGTERM (drained) or SIGINT; returns once it has shut down."""
    try:
        listeners = bind_listeners(server, reuse_port=reuse_port)
    except OSError as exc:
        where = f"{server.host}:{server.port} or {server.ops_host}:{server.ops_port} (ops_port)"
        raise SystemExit(f"floodgate: cannot listen on {where}: {exc.strerror}") from None
    app.state.ops_port = listeners.ops_port
    # The ports bound, not those asked for: port 0 (`serve --port 0`) is one the kernel picked,
    # which nothing else tells the operator.
    log.info(
        "edge_listening",
        public=_address(listeners.public),
        ops=_address(listeners.ops),
        shared_port=reuse_port,
    )
    # A port shared by the workers (edge/workers.py) has no readiness check of its own: the kernel
    # hands a worker connections as soon as it listens. So a worker listens on it only once it may
    # take work; joining the fleet, it has no share of the replicas the edges share for two beats,
    # and would answer 503 no_replica to what the others can serve.
    held = listeners.public if reuse_port else None
    # An empty list, not None, where the public socket is held: None is uvicorn binding its own.
    sockets = [] if held else [listeners.public]
    config = uvicorn_config(app, server, max_connections=app.state.max_connections, log_config=None)
    try:
        DrainingServer(
            config,
            drain,
            held=held,
            ops=listeners.ops,
            may_take_work=lambda: not joining(app.state),
            public=_address(listeners.public),
        ).run(sockets=sockets)
    finally:
        listeners.close()
