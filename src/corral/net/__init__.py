"""corral's network door: the rules, the proxy on the host and the relay inside.

Where a ``[network]`` policy becomes a decision: :mod:`corral.net.rules`
(allow/deny matching), :mod:`corral.net.hooks` (the chain the proxy asks),
:mod:`corral.net.proxy` (HTTP, CONNECT, SOCKS5), :mod:`corral.net.door` (one
socket per run) and :mod:`corral.net.relay` (the sandbox's first process).
"""
