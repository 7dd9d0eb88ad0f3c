"""How fast the proxy checks a response body from a secret's host for an echo.

Run from the repository root::

    python -m bench.echo_scan [--mb N]

A JSON body (a list of items with URLs and escapes, as an API answers) goes
through the secrets hook's body filter in 256 kB pieces, as the proxy feeds
it; MB/s of body and ms of CPU per MB.  The body holds no echo, so it comes
out as it went in (checked).
"""

from __future__ import annotations

import argparse
import json
import os
import time

KEY = "sk-proj-" + "Ab3dE5fG7hI9jK1lM3nO5pQ7rS9tU1vW3xY5zA7bC9dE1fG3"
PIECE = 256 * 1024


def body(megabytes: float) -> bytes:
    items: list[dict[str, object]] = []
    while len(items) * 84 < megabytes * 1e6:
        i = len(items)
        items.append({"id": i, "name": f"item {i}", "url": f"https://api.test/v1/items/{i}?x=%2F"})
    return json.dumps({"items": items}).encode()


def measure(data: bytes, rounds: int = 5) -> float:
    """The best of ``rounds``: seconds of CPU for the whole body."""
    from corral.net.secrets import SecretsHook, _EchoFilter
    from corral.policy import Policy, Secret

    os.environ["BENCH_ECHO_KEY"] = KEY
    policy = Policy("/tmp")
    policy.network.mode = "proxy"
    policy.secrets = {"K": Secret("K", "env:BENCH_ECHO_KEY", ["api.test"])}
    hook = SecretsHook(policy)
    hook.open()
    plan = hook.for_host("api.test", 443)
    best = float("inf")
    for _ in range(rounds):
        scrub = _EchoFilter(plan, {}, None)
        start = time.process_time()
        out = [scrub.feed(data[at : at + PIECE]) for at in range(0, len(data), PIECE)]
        out.append(scrub.end())
        best = min(best, time.process_time() - start)
        assert b"".join(out) == data
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=2.0)
    args = parser.parse_args(argv)
    data = body(args.mb)
    took = measure(data)
    mb = len(data) / 1e6
    print(f"`python -m bench.echo_scan --mb {args.mb:g}`: {mb:.1f} MB of JSON in 256 kB pieces")
    print(f"{mb / took:.0f} MB/s, {took / mb * 1e3:.1f} ms of CPU per MB (best of 5)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
