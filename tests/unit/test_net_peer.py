"""corral.net.peer: the uid owning the client end of a loopback TCP connection."""

from __future__ import annotations

import _socket
import os
import socket
import struct

from corral.net import peer


def test_the_request_names_the_clients_socket() -> None:
    req = peer.lookup(_socket.AF_INET, ("127.0.0.1", 40000), ("127.0.0.1", 3128))
    length, kind, flags = struct.unpack_from("=IHH", req)
    assert (length, kind, flags) == (len(req), peer.SOCK_DIAG_BY_FAMILY, peer.NLM_F_REQUEST)
    assert struct.unpack_from(">HH", req, 24) == (40000, 3128)  # source: the client's port
    assert req[28:32] == bytes([127, 0, 0, 1]) and req[32:44] == bytes(12)


def test_an_error_answer_is_no_uid() -> None:
    error = struct.pack("=IHHII", 36, peer.NLMSG_ERROR, 0, 1, 0) + struct.pack("=i", -2) + bytes(16)
    assert peer.uid_of(error) is None and peer.uid_of(b"") is None


def test_a_real_connection_is_ours() -> None:
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        try:
            server = socket.socket(family, socket.SOCK_STREAM)
            server.bind((host, 0))
        except OSError:
            continue  # no IPv6 here
        server.listen(1)
        client = socket.create_connection(server.getsockname()[:2])
        conn, _ = server.accept()
        try:
            assert peer.client_uid(conn) == os.getuid()
        finally:
            for s in (conn, client, server):
                s.close()
