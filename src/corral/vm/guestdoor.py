"""In the guest, the command's first process when its network goes through corral.

``python -I -S guestdoor.py FD SOCKET -- RELAY-ARGUMENTS...`` (standard library
only; run from the guest's ``/run/corral``, where the init copies it with
``mux.py`` and ``relay.py``).  It listens on the unix socket SOCKET, the door
inside the guest, and carries each connection to the host as a stream on the
door port FD (:mod:`corral.vm.mux`).  Then, in this same process (one Python
start less, which costs a few hundred milliseconds under TCG), it becomes
corral's relay exactly as on the other tiers: loopback proxy ports bound first,
then the command, whose exit status it takes.
"""

import os
import socket
import sys
import threading

if __package__:  # imported as corral.vm.guestdoor (tests, type checking)
    from corral.net import relay
    from corral.vm import mux
else:  # the guest's copy, run as a script beside its mux.py and relay.py
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import mux  # type: ignore[import-not-found, no-redef]
    import relay  # type: ignore[import-not-found, no-redef]


def accept_loop(listener: socket.socket, door: "mux.Mux") -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            continue
        door.attach(conn)


def open_door(fd: int, path: str) -> None:
    """The door inside the guest: the unix socket ``path``, each connection a stream
    on the door port ``fd``, served by threads of this process."""
    os.set_inheritable(fd, False)  # the command must not hold the port
    door = mux.Mux(fd)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1024)
    os.set_inheritable(listener.fileno(), False)
    threading.Thread(target=door.serve, daemon=True).start()
    threading.Thread(target=accept_loop, args=(listener, door), daemon=True).start()


def main(argv: list[str]) -> None:
    relay.one_line_errors("corral-guestdoor")
    if len(argv) < 4 or argv[2] != "--":
        raise SystemExit("usage: guestdoor.py FD SOCKET -- RELAY-ARGUMENTS...")
    open_door(int(argv[0]), argv[1])
    relay.main(argv[3:])


if __name__ == "__main__":
    main(sys.argv[1:])
