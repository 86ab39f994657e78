"""``h5forge server status`` and ``h5forge server stop``: the local Prefect server that build, append
and watch start when no server is configured (_cli/local_server.py)."""

from __future__ import annotations

import typer

from h5forge._cli.app import _Command, _Group, _reported, app, say

server_app = typer.Typer(cls=_Group, no_args_is_help=True, help="The local Prefect server build and append reuse.")
app.add_typer(server_app, name="server")


@server_app.command(cls=_Command)
def status() -> None:
    """Say whether the local Prefect server runs, where, and when it stops itself."""
    from h5forge._cli import local_server  # psutil: the build extra's, as the server

    with _reported():
        minutes = local_server.idle_minutes()
    folder = local_server.state_dir()
    server = local_server.recorded(folder)
    if server is None or local_server.owned_process(server) is None:
        say(f"no local Prefect server runs (state in {folder})")
        return
    answers = "answers" if local_server.answers(server) else "does not answer"
    say(
        f"local Prefect server: pid {server.pid}, {server.url}, Prefect {server.prefect} ({answers}); it stops "
        f"after {minutes:g} min without a command, or on `h5forge server stop`; log: {folder / 'server.log'}"
    )


@server_app.command(cls=_Command)
def stop() -> None:
    """Stop the local Prefect server (the next build or append starts it again)."""
    from h5forge._cli import local_server

    server = local_server.stop()
    if server is None:
        say("no local Prefect server was running")
    else:
        say(f"stopped the local Prefect server (pid {server.pid}, {server.url})")
