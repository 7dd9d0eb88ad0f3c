"""The sandbox's network namespace as a plan: pure builders, nothing launched.

Which listeners a run gets (proxy ports, resolver, allowed host services at
their own address, transparent capture), what the tiers put in NO_PROXY and
the relay's argv, and where the resolver's file is bound.
"""

from __future__ import annotations

import os

import pytest
from syscall_paths import syscalls  # noqa: F401  (the fixture)

from corral import netns
from corral.net.door import proxy_env, relay_argv
from corral.netns import Listener, loopback_services, offline_plan, plan_for, resolv_target
from corral.policy import Policy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable


def policy(allow: list[str], transparent: bool = False) -> Policy:
    p = Policy("/tmp")
    p.network.mode = "proxy"
    p.network.allow = list(allow)
    p.network.transparent = transparent
    return p


@pytest.mark.parametrize(
    ("allow", "deny", "served"),
    [
        (["127.0.0.1:8080"], [], [("127.0.0.1", 8080)]),
        (["[::1]:8080"], [], [("::1", 8080)]),
        (["127.0.0.2:80"], [], [("127.0.0.2", 80)]),  # any loopback address, a low port too
        (["127.0.0.1:8000-8002"], [], [("127.0.0.1", p) for p in (8000, 8001, 8002)]),
        (["127.0.0.1:8000-8002"], ["127.0.0.1:8001"], [("127.0.0.1", 8000), ("127.0.0.1", 8002)]),
        (["127.0.0.1:8080", "127.0.0.1:8080"], [], [("127.0.0.1", 8080)]),  # once
        (["localhost:8080"], [], []),  # a name: through the proxy (and the rebinding guard)
        (["*"], [], []),  # not a host service: nothing to listen for
        (["example.org:443", "10.0.0.1:80"], [], []),  # not loopback
    ],
)
def test_loopback_services_are_the_explicit_loopback_address_and_port_rules(
    allow: list[str], deny: list[str], served: list[tuple[str, int]]
) -> None:
    found, notes = loopback_services(allow, deny)
    assert found == served
    assert notes == []


@pytest.mark.parametrize(
    ("rule", "says"),
    [
        ("127.0.0.1", "one loopback address with a port"),
        ("127.0.0.0/8:8080", "one loopback address with a port"),
        ("127.0.0.1:1-100", "more than 64 host ports"),
        ("127.0.0.1:3128", "the sandbox's own proxy port"),
        ("[::1]:1080", "the sandbox's own proxy port"),
    ],
)
def test_a_loopback_rule_that_cannot_be_served_at_its_address_says_so(rule: str, says: str) -> None:
    found, notes = loopback_services([rule], [])
    assert found == []
    (note,) = notes
    assert rule in note and says in note and "through the proxy" in note


def test_the_plan_has_proxy_ports_a_resolver_and_the_services() -> None:
    plan, notes = plan_for(policy(["pypi.org", "127.0.0.1:8080"]), "/door/handoff.sock")
    assert notes == []
    assert plan.handoff == "/door/handoff.sock" and plan.rules is None
    assert [str(listener) for listener in plan.listeners] == [
        "proxy 127.0.0.1:3128",
        "proxy [::1]:3128",
        "proxy 127.0.0.1:1080",
        "proxy [::1]:1080",
        "dns 127.0.0.1:53/udp",
        "dns [::1]:53/udp",
        "service 127.0.0.1:8080",
    ]
    text = "\n".join(plan.describe())
    assert "held by the proxy" in text and "service 127.0.0.1:8080" in text


def test_transparent_mode_adds_the_capture_port_and_its_rules() -> None:
    plan, _ = plan_for(policy(["pypi.org"], transparent=True), "/h")
    assert Listener("capture", "127.0.0.1", netns.CAPTURE_PORT) in plan.listeners
    assert plan.rules is not None and f"redirect to :{netns.CAPTURE_PORT}" in plan.rules
    assert "udp dport 53 redirect to :53" in plan.rules  # every DNS query to the resolver


def test_a_run_without_a_network_gets_a_resolver_the_launcher_keeps() -> None:
    plan = offline_plan()
    assert plan.handoff is None and plan.rules is None
    assert {listener.kind for listener in plan.listeners} == {"dns"}
    assert "refusing and recording every lookup" in plan.describe()[0]


def test_no_proxy_keeps_loopback_local_except_what_goes_through_the_proxy() -> None:
    env = proxy_env()
    assert env["NO_PROXY"] == env["no_proxy"] == "localhost,127.0.0.1,::1"
    assert env["HTTP_PROXY"] == "http://127.0.0.1:3128"
    landlock = proxy_env(4000, 4000, through_proxy=("127.0.0.1",))
    assert landlock["NO_PROXY"] == "localhost,::1"
    assert landlock["ALL_PROXY"] == landlock["all_proxy"] == "http://127.0.0.1:4000"
    assert landlock["SOCKS_PROXY"] == "socks5h://127.0.0.1:4000"


def test_the_relay_gets_a_resolver_and_each_service() -> None:
    argv = relay_argv(["python3"], [("127.0.0.1", 8080), ("::1", 9000)])
    assert argv[argv.index("--dns") + 1] == "53"
    services = [argv[i + 1] for i, a in enumerate(argv) if a == "--service"]
    assert services == ["127.0.0.1:8080", "[::1]:9000"]


@pytest.mark.parametrize(
    ("host", "target"),
    [
        (("/etc/resolv.conf", True), "/etc/resolv.conf"),
        # systemd-resolved's link: bwrap creates the target in the private /run
        (("/run/systemd/resolve/stub-resolv.conf", False), "/run/systemd/resolve/stub-resolv.conf"),
        (("/etc/resolvconf/run/resolv.conf", False), None),  # a dangling link elsewhere
        (None, None),  # no file at all
    ],
)
def test_where_the_resolver_file_is_bound(
    host: tuple[str, bool] | None, target: str | None
) -> None:
    assert resolv_target(host, ("/tmp", "/run")) == target


def test_the_resolver_file_names_the_sandbox_loopback() -> None:
    with open(netns.resolv_conf(), encoding="utf-8") as fh:
        lines = [line for line in fh.read().splitlines() if not line.startswith("#")]
    assert lines == ["nameserver 127.0.0.1"]


@pytest.mark.usefixtures("syscalls")
def test_entering_again_stays_in_the_namespace_this_process_made(tmp_path: object) -> None:
    """A run planned again after a setup race: its process is already inside, and
    the proxy forked before holds the listeners; a second enter() makes no new
    namespace, hands nothing over again, and refuses another run's handoff.
    Without a network, the resolver's sockets are made again (in the same one)."""

    def child() -> int:
        handoff = str(tmp_path) + "/nobody.sock"  # nobody listens: the handoff is skipped
        networked = netns.NetPlan(handoff, [Listener("proxy", "127.0.0.1", 3128)])
        host = os.stat("/proc/self/ns/net").st_ino
        if netns.enter(networked) != []:
            return 10
        inside = os.stat("/proc/self/ns/net").st_ino
        if inside == host:
            return 11
        if netns.enter(networked) != [] or os.stat("/proc/self/ns/net").st_ino != inside:
            return 12
        try:
            netns.enter(netns.NetPlan(handoff + ".other", networked.listeners))
            return 13
        except OSError:
            pass
        return 0 if os.stat("/proc/self/ns/net").st_ino == inside else 14

    def offline_child() -> int:
        held = netns.enter(offline_plan())
        inside = os.stat("/proc/self/ns/net").st_ino
        for _, fd in held:
            os.close(fd)
        again = netns.enter(offline_plan())  # the last attempt closed its sockets
        ok = [lis.kind for lis, _ in again] == [lis.kind for lis, _ in held] != []
        return 0 if ok and os.stat("/proc/self/ns/net").st_ino == inside else 20

    for fn in (child, offline_child):
        assert _in_child(fn) == 0, fn.__name__


def _in_child(fn: Callable[[], int]) -> int:
    """fn's result, from a forked child (what it does to its process stays there)."""
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            code = fn()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _resolver_answers_inside(held: list[tuple[Listener, int]]) -> bool:
    """A datagram to 127.0.0.1:53, sent from this process's namespace, reaches the
    resolver's descriptor: the sockets are in it and its loopback is up."""
    import socket

    v4 = [fd for listener, fd in held if listener.host == "127.0.0.1"]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as out:
        out.sendto(b"ping", ("127.0.0.1", 53))
        with socket.socket(fileno=os.dup(v4[0])) as sock:
            sock.settimeout(2)
            return sock.recv(16) == b"ping"


@pytest.mark.usefixtures("syscalls")
def test_a_namespace_made_ahead_is_the_one_entered() -> None:
    """corral run starts the namespace of a run without a network on a thread while
    it plans (make_ahead); enter() then moves in and binds the resolver there.
    Until then this process stays where it was.  (Without corral's C module,
    make_ahead does nothing and enter() makes it: the same result.)"""

    def child() -> int:
        host = os.stat("/proc/self/ns/net").st_ino
        netns.make_ahead()
        if os.stat("/proc/self/ns/net").st_ino != host:
            return 10
        held = netns.enter(offline_plan())
        if os.stat("/proc/self/ns/net").st_ino == host or not held:
            return 11
        return 0 if _resolver_answers_inside(held) else 12

    assert _in_child(child) == 0


@pytest.mark.usefixtures("syscalls")
def test_a_networked_run_binds_its_listeners_in_the_namespace_made_ahead() -> None:
    """corral run makes a networked run's namespace ahead too: enter() binds the
    proxy's listeners there and hands them over, and a connection made inside
    reaches them (the deny's twin: the host's own loopback has no such listener,
    so the same connection made before entering is refused)."""
    import socket
    import tempfile

    from corral.netns import Listener, NetPlan, receive

    def child() -> int:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "handoff")
            handoff = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            handoff.bind(path)
            handoff.listen(1)
            port = _free_port()
            netns.make_ahead()
            with socket.socket() as outside:
                if outside.connect_ex(("127.0.0.1", port)) == 0:
                    return 10  # something on the host's loopback has that port
            held = netns.enter(NetPlan(path, [Listener("proxy", "127.0.0.1", port)]))
            got = receive(handoff)
            if held or len(got) != 1:
                return 11
            with socket.create_connection(("127.0.0.1", port), timeout=2):
                fd, _ = got[0][1]._accept()  # type: ignore[attr-defined]  # (_socket's)
                os.close(fd)
            return 0

    assert _in_child(child) == 0


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.usefixtures("syscalls")
def test_no_fork_while_the_namespace_is_made_ahead() -> None:
    """A fork after make_ahead (the guardian's, the proxy's) waits for its thread:
    the child gets a process with one thread and no lock held, and the parent
    is single-threaded again before it forks."""

    def child() -> int:
        netns.make_ahead()
        pid = os.fork()
        if pid == 0:
            os._exit(len(os.listdir("/proc/self/task")))
        threads = len(os.listdir("/proc/self/task"))
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 1 or threads != 1:
            return 10
        held = netns.enter(offline_plan())
        return 0 if _resolver_answers_inside(held) else 11

    assert _in_child(child) == 0


def test_a_namespace_that_could_not_be_made_ahead_is_made_at_enter() -> None:
    """What fails ahead is done again, the usual way, by enter(): here the thread's
    unshare is refused (flag 0x1 is no namespace: EINVAL)."""
    _sys = pytest.importorskip("corral._sys", reason="corral._sys was not built (no C compiler)")

    def child() -> int:
        host = os.stat("/proc/self/ns/net").st_ino
        _sys.netns_ahead(0x1)
        netns._ahead = True
        held = netns.enter(offline_plan())
        if os.stat("/proc/self/ns/net").st_ino == host:
            return 10
        return 0 if _resolver_answers_inside(held) else 11

    assert _in_child(child) == 0


@pytest.mark.usefixtures("syscalls")
def test_unshare_reports_failure_and_its_errno_without_side_effects() -> None:
    """The fast call (no ctypes classes on the path of every run) says only that
    it failed; the reason comes from a second call that keeps errno.  Flag 0x1 is
    no namespace: the kernel refuses it (EINVAL) and nothing changes; flag 0, the
    twin, is a valid unshare of nothing.  Through corral's C module and through
    ctypes' (an install without a C compiler)."""
    import errno

    from corral import netns

    assert netns._unshare(0x1) == -1
    assert netns._unshare_errno(0x1) == errno.EINVAL
    assert netns._unshare(0) == 0


def test_a_users_namespaces_are_made_ahead_and_joined_only_at_enter() -> None:
    """A user other than root gets the user namespace that owns the network one
    made ahead as well (by a child the thread clones): this process stays in the
    host's user namespace until enter(), so what it forks meanwhile (the
    guardian, the proxy) does too; enter() joins both, its ids mapped to
    themselves.  Should the child fail (the twin: a uid no map can hold), enter()
    makes the namespace the usual way."""
    _sys = pytest.importorskip("corral._sys", reason="corral._sys was not built (no C compiler)")

    def child(bad_uid: bool) -> int:
        netns._ahead, netns._entered = False, None  # whatever earlier tests left
        host_user, host_net = os.readlink("/proc/self/ns/user"), os.readlink("/proc/self/ns/net")
        uid = os.geteuid()
        if bad_uid:
            _sys.netns_ahead(netns.CLONE_NEWUSER | netns.CLONE_NEWNET, 0xFFFFFFFF, 0)
            netns._ahead = True
        else:
            asked = iter([uid or 4242])  # make_ahead's question: a user other than root
            os.geteuid = lambda: next(asked, uid)  # (the maps: this process's own uid)
            netns.make_ahead()
        pid = os.fork()  # the guardian's, meanwhile: in the host's user namespace
        if pid == 0:
            os._exit(0 if os.readlink("/proc/self/ns/user") == host_user else 1)
        _, status = os.waitpid(pid, 0)
        if status != 0 or os.readlink("/proc/self/ns/user") != host_user:
            return 10
        held = netns.enter(offline_plan())
        if os.readlink("/proc/self/ns/net") == host_net or not _resolver_answers_inside(held):
            return 11
        if bad_uid:
            return 0
        with open("/proc/self/uid_map", encoding="utf-8") as fh:
            mapped = fh.read().split()
        joined = os.readlink("/proc/self/ns/user") != host_user
        return 0 if joined and mapped == [str(uid), str(uid), "1"] else 12

    assert _in_child(lambda: child(False)) == 0
    assert _in_child(lambda: child(True)) == 0


def test_a_host_service_on_loopback_the_sandbox_cannot_reach_is_named() -> None:
    """pip retried five times against the sandbox's own loopback and nothing said
    why (found by trying corral as a new user).  Twins: a service allowed, one
    nothing serves, and a loopback-like text inside another word get no note."""
    from corral.netns import host_loopback_args

    served = {("127.0.0.1", 8765), ("::1", 5432), ("127.0.0.1", 9000)}
    command = [
        "pip", "install", "--index-url", "http://localhost:8765/simple/", "x",
        "--db=[::1]:5432", "http://127.0.0.1:9000/", "http://127.0.0.1:9999/",
        "not127.0.0.1:8765",
    ]  # fmt: skip
    notes = host_loopback_args(
        command, lambda a, p: (a, p) in served, {"127.0.0.1:9000"}.__contains__
    )
    assert notes == [
        "localhost:8765: the sandbox has a loopback of its own; --allow 127.0.0.1:8765 "
        "reaches the service on the host",
        "[::1]:5432: the sandbox has a loopback of its own; --allow [::1]:5432 "
        "reaches the service on the host",
    ]
