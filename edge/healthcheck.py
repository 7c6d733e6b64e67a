"""`floodgate healthcheck`: the container's liveness probe (Dockerfile.edge's HEALTHCHECK).

It asks the operator listener (`[server] ops_host:ops_port`, read from the same settings as `serve`)
for `/healthz`, not the public one. The image's probe was `urlopen('http://127.0.0.1:8000/healthz')`:
port 8000 whatever `[server] port` said (an edge on another port was unhealthy from its start), and
the public listener, which a drain closes at `drain_accept_s` while the streams run on to
`drain_deadline_s`, and whose accept backlog a client flood fills: either way a live edge failed its
probe and Docker or an orchestrator killed it, cutting the streams. The operator listener answers
`/healthz` until the streams have ended (edge/server.py) and has a backlog of its own.

Exit 0: the edge answered 200. Exit 1 (what Docker reads as unhealthy; 2 is reserved), with one
line on stderr naming the address and what went wrong, never the settings' values (a Redis URL's
password, key hashes). Under `serve --workers` it asks worker 0 (`ops_port`; worker i's is
`ops_port + i`): a worker that exits stops the others (edge/workers.py).
"""

from __future__ import annotations

import argparse
import http.client
import socket
import sys
from typing import Any

import msgspec

from edge.config import ConfigError, ServerConfig, load_settings
from edge.operator_cli import add_config_option

# Under Docker's HEALTHCHECK --timeout (5 s), with room for the interpreter's start.
DEFAULT_TIMEOUT_S = 3.0
# The longest wait `--timeout` takes: far past any probe's, well within a socket timeout's range.
MAX_TIMEOUT_S = 86400.0
# The wildcard addresses a listener may bind, and the loopback address that reaches it then.
_LOOPBACK_OF = {"0.0.0.0": "127.0.0.1", "::": "::1"}


class Unhealthy(Exception):
    """Why the probe failed: one line, for stderr."""


def probe_address(server: ServerConfig) -> tuple[str, int, str]:
    """(host, port, which listener) to ask. The operator listener; where `ops_port` is 0 (a port
    the kernel picked at start, which no setting tells) the public one, the only port known, which
    answers /healthz too; neither known is Unhealthy."""
    if server.ops_port:
        host, port, listener = server.ops_host, server.ops_port, "ops listener"
    elif server.port:
        host, port, listener = server.host, server.port, "public listener: server.ops_port is 0"
    else:
        raise Unhealthy("server.port and server.ops_port are both 0 (picked at start): no port to probe")
    return _LOOPBACK_OF.get(host, host), port, listener


def probe(host: str, port: int, timeout_s: float) -> None:
    """GET /healthz; Unhealthy unless it answers 200 within `timeout_s`. http.client, not urllib:
    urllib sends a loopback request through the proxy of an `http_proxy` variable in the image's
    environment."""
    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        connection.request("GET", "/healthz", headers={"Connection": "close"})
        status = connection.getresponse().status
    except TimeoutError:
        raise Unhealthy(f"{shown}: no answer within {timeout_s:g} s") from None
    except (OSError, http.client.HTTPException) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        if isinstance(exc, socket.gaierror):
            reason = f"cannot resolve the host ({reason})"
        raise Unhealthy(f"{shown}: {reason}") from None
    finally:
        connection.close()
    if status != 200:
        raise Unhealthy(f"{shown}: /healthz answered {status}")


def _healthcheck(args: argparse.Namespace) -> int:
    try:
        settings = load_settings(args.config)
    except (ConfigError, msgspec.ValidationError) as exc:
        # As `serve` words it (a Redis URL's reason is scrubbed of its password, edge/config.py).
        print(f"floodgate healthcheck: invalid settings: {exc}", file=sys.stderr)
        return 1
    try:
        host, port, listener = probe_address(settings.server)
    except Unhealthy as exc:
        print(f"floodgate healthcheck: unhealthy: {exc}", file=sys.stderr)
        return 1
    try:
        probe(host, port, args.timeout)
    except Unhealthy as exc:
        print(f"floodgate healthcheck: unhealthy: {exc} ({listener})", file=sys.stderr)
        return 1
    return 0


def _timeout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text}: give more than 0 seconds")
    if not value <= MAX_TIMEOUT_S:
        # inf, or past what a socket's timeout holds (about 9.2e9 s): the probe's connect was an
        # OverflowError traceback ("timestamp out of range for platform time_t").
        raise argparse.ArgumentTypeError(f"{text}: give at most {MAX_TIMEOUT_S:g} seconds (a day)")
    return value


_HELP = "exit 0 if the edge the settings describe answers /healthz on its operator listener, else 1"


def add_healthcheck_command(commands: Any) -> None:
    """`commands`: the `floodgate` parser's subparsers."""
    _arguments(commands.add_parser("healthcheck", help=_HELP))


def _arguments(check: argparse.ArgumentParser) -> None:
    add_config_option(check)
    check.add_argument(
        "--timeout",
        type=_timeout,
        default=DEFAULT_TIMEOUT_S,
        help=f"seconds to wait for the answer (default {DEFAULT_TIMEOUT_S:g}, at most {MAX_TIMEOUT_S:g})",
    )
    check.set_defaults(handler=_healthcheck)


def main(argv: list[str] | None = None) -> int:
    """`python -m edge.healthcheck`, what the image's HEALTHCHECK runs every 10 s: the same probe
    as `floodgate healthcheck` without loading the rest of the `floodgate` command (its keys, model
    and client commands): about 0.17 s of CPU a probe against 0.37 on a 2-core AMD EPYC, some 2 % of a
    core at that interval rather than 4."""
    parser = argparse.ArgumentParser(prog="python -m edge.healthcheck", description=_HELP)
    _arguments(parser)
    args = parser.parse_args(argv)
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
