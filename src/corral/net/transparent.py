"""Transparent mode: every TCP connection and DNS query of the sandbox goes to corral.

Tools that ignore proxy variables (Node's fetch, Go programs, raw sockets)
still leave only through the proxy.  The sandbox's network namespace is made
by corral as for every networked run (:mod:`corral.netns`); as root, in
transparent mode, it also gets:

* a default route through loopback (so any address is "reachable" ...),
* nftables rules that redirect every TCP connection not to loopback to the
  capture port, and every UDP packet to port 53 to the sandbox's resolver,
  and drop everything else that is not loopback (other UDP, ICMP, ...).

The proxy serves the capture port and the resolver from the host side (their
sockets were handed to it), reading where each connection was going from
netfilter.  The namespace is owned by the host's user namespace, so the
sandbox (in a user namespace of its own, without capabilities) cannot change
the rules.  It lives only as long as the sandbox's processes and the proxy's
sockets: nothing to clean up.

What it cannot see, by construction: the contents of TLS (only the SNI name
of the ClientHello, which Encrypted Client Hello hides); names of protocols
that send nothing first (SSH, SMTP: decided by the name the DNS stand-in
address maps to, or by address rules); QUIC and any other UDP (dropped, so
clients fall back to TCP).
"""

from __future__ import annotations

import os

TRANSPARENT_PORT = 15001
DNS_PORT = 53


def ruleset(tcp_port: int = TRANSPARENT_PORT, dns_port: int = DNS_PORT) -> str:
    """The nftables ruleset for a sandbox's namespace (pure)."""
    return f"""table inet corral {{
  chain capture {{
    type nat hook output priority -100;
    udp dport 53 redirect to :{dns_port}
    meta l4proto tcp ip daddr != 127.0.0.0/8 redirect to :{tcp_port}
    meta l4proto tcp ip6 daddr != ::1 redirect to :{tcp_port}
  }}
  chain only_loopback {{
    type filter hook output priority 0; policy drop;
    ip daddr 127.0.0.0/8 accept
    ip6 daddr ::1 accept
  }}
}}
"""


def nft_binary() -> str | None:
    from shutil import which

    return which("nft", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")


def unavailable() -> str | None:
    """Why transparent mode cannot run here, or None."""
    if os.geteuid() != 0:
        return "transparent mode needs root (it sets nftables rules in the sandbox's namespace)"
    if nft_binary() is None:
        return "transparent mode needs the nft command (Debian: apt-get install nftables)"
    try:
        import pyroute2  # type: ignore[import-untyped, unused-ignore]  # noqa: F401
    except ImportError:
        return "transparent mode needs pyroute2 (pip install pyroute2)"
    return None


def capture(rules: str) -> None:
    """In the launcher's child, inside the sandbox's new network namespace (as
    root): the routes and the nftables rules that send everything to corral."""
    import subprocess

    from pyroute2 import IPRoute  # type: ignore[import-untyped, unused-ignore]

    with IPRoute() as ipr:
        lo = ipr.link_lookup(ifname="lo")[0]
        # a source address on the route, or packets leave as 0.0.0.0 and replies
        # to redirected UDP (DNS) cannot be matched back to their socket
        ipr.route("add", dst="0.0.0.0/0", oif=lo, prefsrc="127.0.0.1")
        ipr.route("add", dst="::/0", oif=lo, family=10, prefsrc="::1")
    done = subprocess.run(
        [nft_binary() or "nft", "-f", "-"], input=rules.encode(), capture_output=True
    )
    if done.returncode != 0:
        raise OSError(f"nft: {done.stderr.decode(errors='replace').strip()}")
