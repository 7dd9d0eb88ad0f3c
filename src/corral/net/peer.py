"""Who is at the other end of a loopback TCP connection: the uid that owns the
client's socket, asked of the kernel with one NETLINK_SOCK_DIAG lookup.

The landlock tier's door is a TCP port on the host's loopback (the tier has no
network namespace), so any local user could connect to it and have the proxy
send requests for them, with the run's credentials ([secrets] with a
``header``) added.  The proxy serves that port only to clients of its own uid
(:meth:`corral.net.proxy.Proxy.serve_tcp_door`): the sandbox, and the user's
other processes, who could read the keys anyway.
"""

from __future__ import annotations

import _socket
import struct

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLMSG_ERROR = 2
NLM_F_REQUEST = 1
_NO_COOKIE = 0xFFFFFFFF
_ALL_STATES = 0xFFFFFFFF
# nlmsghdr (16), then inet_diag_msg: family, state, timer, retrans (4), the socket's
# id (48), expires, rqueue, wqueue (12), uid
_UID_AT = 16 + 4 + 48 + 12


def _address(family: int, host: str) -> bytes:
    """An address as inet_diag_sockid holds it: 16 bytes, network order, left-aligned."""
    return _socket.inet_pton(family, host).ljust(16, b"\0")


def lookup(family: int, src: tuple[str, int], dst: tuple[str, int]) -> bytes:
    """The request for the TCP socket whose own address is ``src`` and whose peer is
    ``dst``: one exact socket, not a dump."""
    sockid = struct.pack(">HH", src[1], dst[1])
    sockid += _address(family, src[0]) + _address(family, dst[0])
    sockid += struct.pack("=III", 0, _NO_COOKIE, _NO_COOKIE)  # any interface, no cookie
    req = struct.pack("=BBBxI", family, _socket.IPPROTO_TCP, 0, _ALL_STATES) + sockid
    return struct.pack("=IHHII", 16 + len(req), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, 1, 0) + req


def uid_of(reply: bytes) -> int | None:
    """The uid in a SOCK_DIAG_BY_FAMILY answer; None for an error or a short answer."""
    if len(reply) < _UID_AT + 4:
        return None
    (kind,) = struct.unpack_from("=H", reply, 4)
    if kind != SOCK_DIAG_BY_FAMILY:
        return None  # NLMSG_ERROR: no such socket (it closed), or sock_diag refused
    (uid,) = struct.unpack_from("=I", reply, _UID_AT)
    return int(uid)


def client_uid(conn: _socket.socket) -> int | None:
    """The uid owning the client end of ``conn`` (a TCP connection we accepted on
    this host), or None when the kernel cannot say."""
    family = conn.family
    ours, theirs = conn.getsockname()[:2], conn.getpeername()[:2]
    nl = _socket.socket(_socket.AF_NETLINK, _socket.SOCK_DGRAM, NETLINK_SOCK_DIAG)
    try:
        nl.settimeout(1.0)
        nl.send(lookup(family, theirs, ours))  # the client's socket: its source is them
        return uid_of(nl.recv(8192))
    finally:
        nl.close()
