"""`overnight serve`: the long-running service (uvicorn + APScheduler in one process)."""

from __future__ import annotations

import logging
import socket
import sys
from pathlib import Path
from typing import Annotated

import typer

from overnight.cli_common import (
    DbOpt,
    DevicesOpt,
    SlotsOpt,
    app,
    console,
    db_path,
    fail,
    slots_and_devices,
)

logger = logging.getLogger(__name__)


@app.command()
def serve(
    db: DbOpt = None,
    host: Annotated[str, typer.Option(help="address to bind (non-loopback needs auth)")]
    = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="port (0: any free port)")] = 8000,
    slots: SlotsOpt = None,
    devices: DevicesOpt = None,
    token: Annotated[str | None, typer.Option(envvar="OVERNIGHT_TOKEN", help="bearer token "
                                              "(default: created beside the database)")] = None,
    no_auth: Annotated[bool, typer.Option("--no-auth", help="no token at all (loopback only)")]
    = False,
    poll: Annotated[float, typer.Option(help="seconds between idle slot checks")] = 1.0,
    log_level: Annotated[str, typer.Option(help="uvicorn/app log level")] = "info",
) -> None:
    """Run the REST API and the experiment scheduler (one process, one worker)."""
    import uvicorn

    from agent.recovery import InstanceLock, InstanceLockError
    from api.settings import Settings, ensure_token
    from overnight.runtime import service_app

    db_file = db_path(db).resolve()
    token_path: Path | None = None
    if not no_auth and not token:
        token, token_path, created = ensure_token(db_file)
        console.print(f"token {'created in' if created else 'read from'} {token_path} "
                      "(send it as 'Authorization: Bearer <token>')")
    slots, found = slots_and_devices(slots, devices)
    settings = Settings.build(db_path=db_file, host=host, port=port, slots=slots, devices=found,
                              token=None if no_auth else token, auth=not no_auth,
                              poll_interval_s=poll)
    try:
        lock = InstanceLock(db_file).acquire()
    except InstanceLockError as exc:
        fail(str(exc))
        return
    logging.getLogger().setLevel(log_level.upper())
    if logging.getLogger().level > logging.DEBUG:  # its two lines per second are debug noise
        logging.getLogger("apscheduler").setLevel(logging.WARNING)
    try:
        sock = _bind(host, port)
    except OSError as exc:
        lock.release()
        fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
        return
    bound = sock.getsockname()[1]
    url_host = f"[{host}]" if ":" in host else host
    console.print(f"overnight serve: db {db_file}, {slots} slot(s), auth "
                  f"{'off' if no_auth else 'on'}, listening on http://{url_host}:{bound}/",
                  soft_wrap=True)
    sys.stdout.flush()
    config = uvicorn.Config(service_app(settings, lock=lock), host=host, port=bound, workers=1,
                            log_level=log_level, timeout_graceful_shutdown=int(settings.grace_s)
                            + 15)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        lock.release()


def _bind(host: str, port: int) -> socket.socket:
    """Bind before uvicorn starts so `--port 0` can be reported and a busy port fails early."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock
