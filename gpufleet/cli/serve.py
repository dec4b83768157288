"""``gpufleet serve``: the dashboard, the JSON API, the alert webhook and the standing monitor, in one server."""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from gpufleet.cli.options import check_path_name
from gpufleet.cli.render import console, err_console
from gpufleet.errors import UsageError, parameters_as_flags
from gpufleet.outfiles import check_replaceable_file, write_port_file
from gpufleet.paths import gpufleet_home
from gpufleet.serve.limits import MAX_CONNECTIONS, REQUEST_TIMEOUT_S

HostOpt = Annotated[str, typer.Option("--host", help="Interface to listen on (default: loopback only).")]
PortOpt = Annotated[int, typer.Option("--port", help="TCP port (0: any free one).", min=0, max=65535)]


@parameters_as_flags(
    {"token_file": "--token-file", "monitor": "--monitor", "webhook_secret_file": "--webhook-secret-file"}
)
def serve_command(
    host: HostOpt = "127.0.0.1",
    port: PortOpt = 8642,
    token_file: Annotated[
        Path | None,
        typer.Option(
            "--token-file",
            help="Bearer token for actions (preempt, cancel, hold, release, promote, roll back); made (mode 600) "
            "if missing. "
            "Default: $GPUFLEET_HOME/serve.token.",
        ),
    ] = None,
    no_token: Annotated[
        bool, typer.Option("--no-token", help="No token: the server only reads, every action is refused.")
    ] = False,
    monitor: Annotated[
        Path | None,
        typer.Option("--monitor", help="Run this standing monitor's rounds (quality monitor run FILE) while serving."),
    ] = None,
    webhook_secret_file: Annotated[
        Path | None,
        typer.Option(
            "--webhook-secret-file",
            help="Secret of the signed alert webhook POST /hooks/alerts "
            "(default: $GPUFLEET_WEBHOOK_SECRET(_FILE); none: the route answers 503).",
        ),
    ] = None,
    openapi: Annotated[
        Path | None, typer.Option("--openapi", help="Write the API's OpenAPI document to this file and exit.")
    ] = None,
    refresh: Annotated[
        float, typer.Option("--refresh", help="Seconds between the pages' updates.", min=0.2, max=3600)
    ] = 2.0,
    port_file: Annotated[
        Path | None, typer.Option("--port-file", help="Write the port listened on to this file once it listens.")
    ] = None,
    cache: Annotated[
        float,
        typer.Option(
            "--cache",
            help="Seconds the job list, fleet and cost views may be reused (0: rebuild each); a view in use is "
            "rebuilt in the background shortly before it expires, so it is never served older.",
            min=0,
            max=3600,
        ),
    ] = 1.0,
    allowed_host: Annotated[
        list[str] | None,
        typer.Option(
            "--allowed-host",
            help="A name clients may reach the server by (the Host header), besides loopback ones and --host; "
            "repeatable. Other names are refused (400): a guard against DNS rebinding.",
        ),
    ] = None,
    request_timeout: Annotated[
        float,
        typer.Option(
            "--request-timeout",
            help="Seconds a client has to send a whole request; a slower connection is closed.",
            min=0.05,
            max=3600,
        ),
    ] = REQUEST_TIMEOUT_S,
    max_connections: Annotated[
        int,
        typer.Option(
            "--max-connections",
            help="Connections open at once (fewer if file descriptors are scarce); more are answered 503.",
            min=1,
            max=1_000_000,
        ),
    ] = MAX_CONNECTIONS,
) -> None:
    """Serve the fleet: pages (fleet, jobs, cost, quality), the JSON API and the signed alert webhook."""
    from gpufleet.serve.app import ServeConfig, create_app, openapi_document
    from gpufleet.serve.auth import is_loopback, load_token
    from gpufleet.serve.guard import accepted_hosts
    from gpufleet.serve.limits import uvicorn_config

    if openapi is not None:
        check_path_name(openapi, "--openapi").write_text(json.dumps(openapi_document(), indent=2) + "\n")
        console.print(f"wrote {openapi}", highlight=False, markup=False)
        return
    home = gpufleet_home()
    if monitor is not None:
        from gpufleet.quality.standing import load_monitor_config

        load_monitor_config(check_path_name(monitor, "--monitor"))  # a bad file is refused before the port opens
    secret = _webhook_secret(webhook_secret_file)
    if port_file is not None:
        check_replaceable_file(check_path_name(port_file, "--port-file"), "--port-file")
    address = _address(host, port)  # everything is checked before the token file may be made
    allowed = tuple(allowed_host or ())
    accepted_hosts(host, allowed)
    token = None
    if not no_token:
        path = check_path_name(token_file, "--token-file") if token_file is not None else home / "serve.token"
        token = load_token(path)
        token_note = f"actions need the token in {path}"
    else:
        token_note = "no token: read only"
    if not is_loopback(host) and token is None:
        err_console.print(
            f"warning: listening on {host} without a token: anyone who reaches it reads the fleet",
            highlight=False,
            markup=False,
        )
    sock = _listen(address, host, port)
    port = sock.getsockname()[1]
    cfg = ServeConfig(
        home=home,
        token=token,
        monitor=monitor,
        webhook_secret=secret,
        refresh_s=refresh,
        cache_s=cache,
        host=host,
        allowed_hosts=allowed,
        request_timeout_s=request_timeout,
        max_connections=max_connections,
    )
    app = create_app(cfg)
    config = uvicorn_config(app, request_timeout_s=cfg.request_timeout_s, max_connections=cfg.max_connections)
    server = _make_server(config)
    logging.getLogger("gpufleet.serve").setLevel(logging.INFO)
    shown = f"[{host}]" if ":" in host else host
    console.print(
        f"gpufleet serve: http://{shown}:{port}/ over {home}; {token_note}"
        + (f"; monitor {monitor}" if monitor else "")
        + ("; webhook POST /hooks/alerts" if secret else ""),
        highlight=False,
        markup=False,
    )
    for signum in (signal.SIGTERM, signal.SIGINT):  # a clean stop: requests in flight end, exit 0
        signal.signal(signum, lambda *_: setattr(server, "should_exit", True))
    if port_file is not None:
        write_port_file(port_file, port)
    server.run(sockets=[sock])


def _make_server(config: Any) -> Any:
    """A uvicorn server without uvicorn's signal handling, which re-raises SIGTERM once it has stopped
    (the process would die of the signal): ``serve_command`` sets ``should_exit`` instead."""
    from gpufleet.extras import required

    with required("uvicorn", "serve", "gpufleet serve"):
        import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return Server(config)


def _address(host: str, port: int) -> tuple[Any, ...]:
    """Where ``--host`` and ``--port`` say to listen (``getaddrinfo``'s first answer), or one line saying why not."""
    if not host.strip():
        raise UsageError("--host is empty: give an address to listen on (0.0.0.0 for every interface)")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError, ValueError) as err:
        raise UsageError(
            f"--host {host[:80]!r} is not an address to listen on ({err}): give an IP or a host name"
        ) from None
    family, kind, proto, _, address = infos[0]
    return family, kind, proto, address


def _listen(where: tuple[Any, ...], host: str, port: int) -> socket.socket:
    """A listening TCP socket at ``where`` (port 0: a free one), or one line saying why not."""
    family, kind, proto, address = where
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(2048)
    except OSError as err:
        sock.close()
        raise UsageError(f"cannot listen on {host[:80]}:{port}: {err.strerror or err}") from None
    return sock


def _webhook_secret(path: Path | None) -> bytes | None:
    """The webhook's secret from the flag or the environment; None when neither gives one."""
    import os

    from gpufleet.quality.webhook import load_secret

    if path is None and not (
        os.environ.get("GPUFLEET_WEBHOOK_SECRET") or os.environ.get("GPUFLEET_WEBHOOK_SECRET_FILE")
    ):
        return None
    return load_secret(check_path_name(path, "--webhook-secret-file") if path is not None else None)


__all__ = ["serve_command"]
