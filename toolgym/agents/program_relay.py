"""The first process inside a sandboxed agent program: the endpoint reachable at its usual
address, and nothing else, then the program.

A program sandboxed by `command_program(..., sandbox="process")` lives in a network namespace
of its own, whose loopback reaches nothing of the host. Its `OPENAI_BASE_URL` still says
`http://127.0.0.1:PORT/v1`: this relay listens there, inside the namespace, and carries each
connection, byte for byte, to a Unix socket the host bound into the sandbox read-only, behind
which the host side (`toolgym.agents.program_sandbox`) carries it on to the endpoint. Then it
runs the program with the descriptors and environment it was given and exits with its status.

    python -I program_relay.py SOCKET PORT -- PROGRAM [ARGUMENTS...]

Standard library only, runnable as a file (it imports nothing of toolgym).
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading

SETUP_FAILED = 70
"""The relay's status when the sandbox could not be set up (`PROGRAM_BUG_EXIT` of
`toolgym.agents.program`: not the model's doing)."""


def main(argv: list[str]) -> int:
    """Serve the endpoint's address inside the sandbox, run the program, and return its exit
    status (`SETUP_FAILED` when the sandbox cannot serve the address or start it)."""
    if len(argv) < 5 or argv[3] != "--":
        raise SystemExit("usage: program_relay.py SOCKET PORT -- PROGRAM [ARGUMENTS...]")
    path, port, command = argv[1], int(argv[2]), argv[4:]
    try:
        listener = socket.create_server(("127.0.0.1", port))
    except OSError as error:  # e.g. a port below 1024, which uid 65534 may not bind
        print(f"the sandbox cannot serve 127.0.0.1:{port}: {error}", file=sys.stderr)
        return SETUP_FAILED
    threading.Thread(target=_accept, args=(listener, path), daemon=True).start()
    try:
        program = subprocess.Popen(command)  # the relay's own stdin, stdout, stderr, environment
    except OSError as error:  # not in the sandbox's view (`paths=`)
        print(f"cannot start {command[0]} in the sandbox: {error}", file=sys.stderr)
        return SETUP_FAILED
    status = program.wait()
    return status if status >= 0 else 128 - status  # killed by a signal: as a shell says


def _accept(listener: socket.socket, path: str) -> None:
    while True:
        client, _ = listener.accept()
        threading.Thread(target=_carry, args=(client, path), daemon=True).start()


def _carry(client: socket.socket, path: str) -> None:
    """One connection, both ways, until either side closes."""
    with client, socket.socket(socket.AF_UNIX) as host:
        try:
            host.connect(path)
        except OSError:
            return  # the host side is gone: the program's request fails as a refused one
        back = threading.Thread(target=_pump, args=(host, client), daemon=True)
        back.start()
        _pump(client, host)
        back.join()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while chunk := source.recv(1 << 16):
            sink.sendall(chunk)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
