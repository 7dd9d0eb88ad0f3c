"""corral.net.aio, the proxy's event loop, on its own: tasks, cancellation and
timeouts, timers, threads, streams with their limits and flow control,
half-close, servers, datagrams and TLS, on real sockets on loopback."""

from __future__ import annotations

import _socket
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from corral.net import aio

# -- tasks, futures, cancellation --------------------------------------------------------------


def test_run_returns_the_result_and_tasks_interleave() -> None:
    order: list[str] = []

    async def worker(name: str) -> str:
        for i in range(3):
            order.append(f"{name}{i}")
            await aio.sleep(0)
        return name

    async def main() -> list[object]:
        return list(await aio.gather(worker("a"), worker("b")))

    assert aio.run(main()) == ["a", "b"]
    assert order == ["a0", "b0", "a1", "b1", "a2", "b2"]


def test_an_exception_in_a_task_reaches_its_awaiter() -> None:
    async def boom() -> None:
        await aio.sleep(0)
        raise KeyError("x")

    async def main() -> None:
        task = aio.get_running_loop().create_task(boom())
        with pytest.raises(KeyError):
            await task

    aio.run(main())


def test_cancel_raises_inside_the_awaiting_coroutine_and_cleanup_runs() -> None:
    seen: list[str] = []

    async def sleeper() -> None:
        try:
            await aio.sleep(10)
        except aio.CancelledError:
            seen.append("cancelled")
            raise
        finally:
            seen.append("finally")

    async def main() -> None:
        task = aio.get_running_loop().create_task(sleeper())
        await aio.sleep(0.01)
        task.cancel()
        with pytest.raises(aio.CancelledError):
            await task
        assert task.cancelled()

    aio.run(main())
    assert seen == ["cancelled", "finally"]


def test_cancelled_error_is_not_an_exception() -> None:
    assert not issubclass(aio.CancelledError, Exception)


def test_timeout_turns_its_cancellation_into_timeout_error_and_only_that() -> None:
    async def main() -> None:
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            async with aio.timeout(0.05):
                await aio.sleep(5)
        assert time.monotonic() - started < 1
        async with aio.timeout(1):  # in time: nothing happens
            await aio.sleep(0.01)
        await aio.sleep(0.02)  # and no cancellation is left pending afterwards

    aio.run(main())


def test_an_outer_cancel_inside_a_timeout_stays_a_cancel() -> None:
    async def inner() -> None:
        async with aio.timeout(5):
            await aio.sleep(5)

    async def main() -> None:
        task = aio.get_running_loop().create_task(inner())
        await aio.sleep(0.01)
        task.cancel()
        with pytest.raises(aio.CancelledError):
            await task

    aio.run(main())


def test_wait_for_times_out_and_passes_results() -> None:
    async def slow() -> int:
        await aio.sleep(5)
        return 1

    async def fast() -> int:
        await aio.sleep(0)
        return 2

    async def main() -> None:
        with pytest.raises(TimeoutError):
            await aio.wait_for(slow(), 0.05)
        assert await aio.wait_for(fast(), 1) == 2
        assert await aio.wait_for(fast(), None) == 2

    aio.run(main())


def test_wait_first_completed_and_gather_with_exceptions() -> None:
    async def after(delay: float, value: object) -> object:
        await aio.sleep(delay)
        if isinstance(value, BaseException):
            raise value
        return value

    async def main() -> None:
        loop = aio.get_running_loop()
        quick = loop.create_task(after(0.01, "quick"))
        slow = loop.create_task(after(5, "slow"))
        done, pending = await aio.wait([quick, slow], return_when=aio.FIRST_COMPLETED)
        assert done == {quick} and pending == {slow}
        slow.cancel()
        results = await aio.gather(slow, after(0, ValueError("v")), return_exceptions=True)
        assert isinstance(results[0], aio.CancelledError)
        assert isinstance(results[1], ValueError)

    aio.run(main())


def test_cancelling_a_gather_cancels_its_children_and_the_awaiter() -> None:
    async def main() -> None:
        loop = aio.get_running_loop()
        children = [loop.create_task(aio.sleep(5)) for _ in range(2)]

        async def waiter() -> None:
            await aio.gather(*children, return_exceptions=True)

        task = loop.create_task(waiter())
        await aio.sleep(0.01)
        task.cancel()
        with pytest.raises(aio.CancelledError):
            await task
        assert all(c.cancelled() for c in children)

    aio.run(main())


def test_run_cancels_what_is_left_at_the_end() -> None:
    cleaned: list[bool] = []

    async def forever() -> None:
        try:
            await aio.sleep(100)
        finally:
            cleaned.append(True)

    async def main() -> None:
        aio.get_running_loop().create_task(forever())
        await aio.sleep(0.01)

    aio.run(main())
    assert cleaned == [True]


def test_timers_fire_in_order_and_a_cancelled_one_never() -> None:
    fired: list[int] = []

    async def main() -> None:
        loop = aio.get_running_loop()
        loop.call_later(0.03, fired.append, 3)
        loop.call_later(0.01, fired.append, 1)
        loop.call_later(0.02, fired.append, 2).cancel()
        loop.call_soon(fired.append, 0)
        await aio.sleep(0.05)

    aio.run(main())
    assert fired == [0, 1, 3]


def test_a_failing_callback_goes_to_the_exception_handler_and_the_loop_goes_on() -> None:
    seen: list[str] = []

    def bad() -> None:
        raise RuntimeError("bad callback")

    async def main() -> None:
        loop = aio.get_running_loop()
        loop.set_exception_handler(lambda _l, ctx: seen.append(str(ctx["exception"])))
        loop.call_soon(bad)
        await aio.sleep(0.01)

    aio.run(main())
    assert seen == ["bad callback"]


def test_threads_reach_the_loop() -> None:
    async def main() -> None:
        loop = aio.get_running_loop()
        assert await loop.run_in_executor(None, lambda: threading.get_ident()) != (
            threading.get_ident()
        )
        event = aio.Event()
        threading.Timer(0.02, loop.call_soon_threadsafe, (event.set,)).start()
        await aio.wait_for(event.wait(), 5)
        infos = await loop.getaddrinfo("localhost", 80, type=_socket.SOCK_STREAM)
        assert infos
        with pytest.raises(OSError):
            await loop.run_in_executor(None, _raise_os_error)

    aio.run(main())


def _raise_os_error() -> None:
    raise OSError("from a thread")


def test_a_signal_handler_runs_on_the_loop() -> None:
    got: list[int] = []

    async def main() -> None:
        loop = aio.get_running_loop()
        event = aio.Event()

        def on_signal() -> None:
            got.append(1)
            event.set()

        loop.add_signal_handler(signal.SIGUSR1, on_signal)
        os.kill(os.getpid(), signal.SIGUSR1)
        await aio.wait_for(event.wait(), 5)
        loop.remove_signal_handler(signal.SIGUSR1)

    aio.run(main())
    assert got == [1]


def test_importing_it_costs_no_asyncio() -> None:
    code = "import sys, corral.net.aio, corral.net.proxy; print(sorted(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    for heavy in ("asyncio", "ssl", "typing", "logging", "ipaddress", "concurrent"):
        assert f"'{heavy}'" not in out.stdout, heavy


# -- streams and transports --------------------------------------------------------------------


def test_streams_readexactly_readuntil_and_incomplete() -> None:
    async def main() -> None:
        async def serve(reader: aio.StreamReader, writer: aio.StreamWriter) -> None:
            writer.write(b"line one\nexact")
            await writer.drain()
            writer.close()

        server = await aio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await aio.open_connection("127.0.0.1", port)
        assert await reader.readuntil(b"\n") == b"line one\n"
        assert await reader.readexactly(3) == b"exa"
        with pytest.raises(aio.IncompleteReadError) as caught:
            await reader.readexactly(10)
        assert caught.value.partial == b"ct"
        assert reader.at_eof()
        writer.close()
        server.close()

    aio.run(main())


def test_readuntil_beyond_the_limit_is_a_limit_overrun() -> None:
    async def main() -> None:
        reader = aio.StreamReader(limit=16)
        reader.feed_data(b"x" * 40)
        with pytest.raises(aio.LimitOverrunError):
            await reader.readuntil(b"\n")
        reader.feed_data(b"\n")
        reader.feed_eof()
        assert reader.buffered == 41  # left in place, as asyncio does
        assert reader.take_buffered() == b"x" * 40 + b"\n"

    aio.run(main())


def test_a_full_reader_pauses_its_transport_and_resumes_when_read() -> None:
    async def main() -> None:
        total = 4 * 1024 * 1024
        got = bytearray()

        async def serve(reader: aio.StreamReader, writer: aio.StreamWriter) -> None:
            writer.write(b"z" * total)
            await writer.drain()  # waits while the peer does not read: bounded memory
            writer.close()

        server = await aio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await aio.open_connection("127.0.0.1", port, limit=1024)
        await aio.sleep(0.1)  # not reading: the reader pauses at twice its limit
        assert reader.buffered <= 2 * 1024 + aio.MAX_READ
        while chunk := await reader.read(65536):
            got += chunk
        assert len(got) == total
        writer.close()
        server.close()

    aio.run(main())


def test_half_close_both_ways() -> None:
    async def main() -> None:
        async def serve(reader: aio.StreamReader, writer: aio.StreamWriter) -> None:
            data = await reader.read()  # until the client's EOF
            writer.write(data.upper())  # and still answer after it
            await writer.drain()
            writer.close()

        server = await aio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await aio.open_connection("127.0.0.1", port)
        writer.write(b"hello")
        assert writer.can_write_eof()
        writer.write_eof()
        assert await reader.read() == b"HELLO"
        writer.close()
        server.close()

    aio.run(main())


def test_a_refused_connection_and_a_closed_peer_raise_connection_errors() -> None:
    async def main() -> None:
        probe = _socket.socket()
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        probe.close()  # nobody listens there now
        with pytest.raises(ConnectionRefusedError):
            await aio.open_connection("127.0.0.1", port)

        async def serve(reader: aio.StreamReader, writer: aio.StreamWriter) -> None:
            writer.transport.abort()

        server = await aio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await aio.open_connection("127.0.0.1", port)
        assert await reader.read(10) == b""
        with pytest.raises(ConnectionError):
            for _ in range(50):
                writer.write(b"x" * 65536)
                await writer.drain()
                await aio.sleep(0.01)
        server.close()

    aio.run(main())


def test_unix_server_and_wait_closed() -> None:
    async def main(path: str) -> None:
        async def serve(reader: aio.StreamReader, writer: aio.StreamWriter) -> None:
            writer.write(await reader.readline())
            await writer.drain()
            writer.close()

        server = await aio.start_unix_server(serve, path)
        reader, writer = await aio.open_unix_connection(path)
        writer.write(b"ping\n")
        assert await reader.readline() == b"ping\n"
        writer.close()
        await writer.wait_closed()
        server.close()
        await server.wait_closed()

    with_tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"aio-{os.getpid()}.sock"
    try:
        aio.run(main(str(with_tmp)))
    finally:
        with_tmp.unlink(missing_ok=True)


def test_datagrams_both_ways() -> None:
    class Echo(aio.DatagramProtocol):
        def connection_made(self, transport: aio.DatagramTransport) -> None:
            self.transport = transport

        def datagram_received(self, data: bytes, addr: object) -> None:
            self.transport.sendto(data[::-1], addr)

    async def main() -> None:
        sock = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        transport, _ = await aio.get_running_loop().create_datagram_endpoint(Echo, sock=sock)
        client = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
        client.setblocking(False)
        client.sendto(b"abc", ("127.0.0.1", port))
        assert await aio.get_running_loop().sock_recv(client, 100) == b"cba"
        client.close()
        transport.close()

    aio.run(main())


# -- TLS -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server context with a self-signed certificate for localhost, and a
    client context that trusts it."""
    from corral.net.ca import Issuer, create

    ca = create("corral test CA", 1, "test")
    issuer = Issuer(ca)
    cert_pem, _ = issuer.leaf("localhost")
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    chain = tmp_path_factory.mktemp("leaf") / "leaf.pem"
    chain.write_bytes(cert_pem + issuer.key_pem)
    server.load_cert_chain(str(chain))
    client = ssl.create_default_context()
    client.load_verify_locations(cadata=ca.cert_pem.decode())
    return server, client


def test_tls_both_sides_with_early_bytes_and_big_bodies(
    tls_pair: tuple[ssl.SSLContext, ssl.SSLContext],
) -> None:
    server_ctx, client_ctx = tls_pair
    big = os.urandom(3 * 1024 * 1024)

    async def main() -> None:
        loop = aio.get_running_loop()

        async def serve(reader: aio.StreamReader, writer: aio.StreamWriter) -> None:
            early = await reader.read(5)  # a ClientHello's first bytes, read as plain
            early += reader.take_buffered()  # and the rest the stream holds already
            protocol = aio.StreamReaderProtocol(aio.StreamReader())
            inner = protocol._reader
            tls = await loop.start_tls(
                writer.transport, protocol, server_ctx, server_side=True, initial=early
            )
            out = aio.StreamWriter(tls, protocol, inner)
            request = await inner.readexactly(len(big))
            out.write(request[::-1])
            await out.drain()
            out.close()

        server = await aio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await aio.open_connection(
            "127.0.0.1", port, ssl=client_ctx, server_hostname="localhost"
        )
        assert writer.get_extra_info("ssl_object").version() in ("TLSv1.3", "TLSv1.2")
        writer.write(big)
        await writer.drain()
        answer = await reader.readexactly(len(big))
        assert answer == big[::-1]
        assert await reader.read() == b""  # the server's close_notify: a clean end
        writer.close()
        server.close()

    aio.run(main())


def test_a_servers_session_tickets_go_out_with_its_first_response(
    tls_pair: tuple[ssl.SSLContext, ssl.SSLContext],
) -> None:
    """TLS 1.3: the tickets a server makes once the handshake is done wait for its
    first write (one send, not two), and still reach the client: it resumes."""
    import socket
    import threading

    server_ctx, client_ctx = tls_pair
    writes: list[int] = []

    async def main() -> None:
        loop = aio.get_running_loop()

        async def serve(reader: aio.StreamReader, writer: aio.StreamWriter) -> None:
            raw = writer.transport
            send = raw.write

            def counted(data: bytes | bytearray | memoryview) -> None:
                writes.append(len(data))
                send(data)

            raw.write = counted  # type: ignore[method-assign]
            protocol = aio.StreamReaderProtocol(aio.StreamReader())
            tls = await loop.start_tls(raw, protocol, server_ctx, server_side=True)
            assert await protocol._reader.readexactly(4) == b"ping"
            tls.write(b"pong")
            tls.close()

        server = await aio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        sessions: list[ssl.SSLSession | None] = []
        reused: list[bool | None] = []

        def client() -> None:
            for session in (None, "the first one's"):
                with socket.create_connection(("127.0.0.1", port)) as sock:
                    given = sessions[0] if session else None
                    with client_ctx.wrap_socket(
                        sock, server_hostname="localhost", session=given
                    ) as tls:
                        tls.sendall(b"ping")
                        assert tls.recv(4) == b"pong"
                        sessions.append(tls.session)
                        reused.append(tls.session_reused)

        thread = threading.Thread(target=client)
        thread.start()
        while thread.is_alive():
            await aio.sleep(0.01)
        server.close()
        assert sessions[0] is not None and sessions[0].has_ticket
        assert reused == [False, True]  # the ticket that came with "pong" resumed

    aio.run(main())
    first = writes[: len(writes) // 2]  # the first connection's writes (both make as many)
    assert len(first) == 3  # the handshake flight; tickets + "pong"; close_notify


def test_a_tls_1_2_client_gets_the_servers_last_flight_at_once(
    tls_pair: tuple[ssl.SSLContext, ssl.SSLContext],
) -> None:
    """The twin: TLS 1.2 ends with the server's Finished, which the client waits for
    before it says anything: held back, neither side would move."""
    import socket
    import threading

    server_ctx, client_ctx = tls_pair
    old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    old.maximum_version = ssl.TLSVersion.TLSv1_2
    named = client_ctx.get_ca_certs()
    ours = next(i for i, c in enumerate(named) if "corral test CA" in str(c["subject"]))
    old.load_verify_locations(cadata=client_ctx.get_ca_certs(binary_form=True)[ours])

    async def main() -> None:
        loop = aio.get_running_loop()

        async def serve(reader: aio.StreamReader, writer: aio.StreamWriter) -> None:
            protocol = aio.StreamReaderProtocol(aio.StreamReader())
            tls = await loop.start_tls(writer.transport, protocol, server_ctx, server_side=True)
            assert await protocol._reader.readexactly(4) == b"ping"
            tls.write(b"pong")
            tls.close()

        server = await aio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        got: list[tuple[str | None, bytes]] = []

        def client() -> None:
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            with old.wrap_socket(sock, server_hostname="localhost") as tls:
                tls.sendall(b"ping")
                got.append((tls.version(), tls.recv(4)))

        thread = threading.Thread(target=client)
        thread.start()
        while thread.is_alive():
            await aio.sleep(0.01)
        server.close()
        assert got == [("TLSv1.2", b"pong")]

    aio.run(main())


def test_an_untrusted_server_fails_the_handshake_and_a_trusted_name_passes(
    tls_pair: tuple[ssl.SSLContext, ssl.SSLContext],
) -> None:
    server_ctx, client_ctx = tls_pair

    async def main() -> None:
        loop = aio.get_running_loop()

        async def serve(reader: aio.StreamReader, writer: aio.StreamWriter) -> None:
            protocol = aio.StreamReaderProtocol(aio.StreamReader())
            try:
                tls = await loop.start_tls(writer.transport, protocol, server_ctx, server_side=True)
            except (ssl.SSLError, ConnectionError):
                return
            tls.write(b"hi")
            tls.close()

        server = await aio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        with pytest.raises(ssl.SSLCertVerificationError):  # the wrong name
            await aio.open_connection("127.0.0.1", port, ssl=client_ctx, server_hostname="other")
        with pytest.raises(ssl.SSLCertVerificationError):  # nobody's CA
            await aio.open_connection(
                "127.0.0.1", port, ssl=ssl.create_default_context(), server_hostname="localhost"
            )
        reader, writer = await aio.open_connection(
            "127.0.0.1", port, ssl=client_ctx, server_hostname="localhost"
        )
        assert await reader.read() == b"hi"
        writer.close()
        server.close()

    aio.run(main())


def test_a_tls_handshake_that_never_comes_times_out(
    tls_pair: tuple[ssl.SSLContext, ssl.SSLContext],
) -> None:
    server_ctx, _ = tls_pair

    async def main() -> None:
        loop = aio.get_running_loop()
        outcome: list[BaseException] = []

        async def serve(reader: aio.StreamReader, writer: aio.StreamWriter) -> None:
            protocol = aio.StreamReaderProtocol(aio.StreamReader())
            try:
                await loop.start_tls(
                    writer.transport, protocol, server_ctx, server_side=True,
                    ssl_handshake_timeout=0.1,
                )  # fmt: skip
            except BaseException as exc:
                outcome.append(exc)

        server = await aio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await aio.open_connection("127.0.0.1", port)  # says nothing
        assert await aio.wait_for(reader.read(), 5) == b""  # closed by the server
        assert outcome and isinstance(outcome[0], TimeoutError)
        writer.close()
        server.close()

    aio.run(main())
