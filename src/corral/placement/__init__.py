"""Where a sandbox runs, apart from how it is isolated (the tiers).

A tier turns a policy into a confined process; a placement decides which machine
builds it and how the caller reaches the agent inside.  Two placements exist:

* :class:`Local`: this machine; the agent's channel is a socket pair.
* :class:`Ray`: a node of a Ray cluster, chosen by Ray's scheduler; the node
  builds the sandbox with its own corral (used by :mod:`corral.batch`).

Importing this package imports neither Ray nor anything heavy: ``corral doctor``
and ``Sandbox`` use it.
"""

from __future__ import annotations

import socket


class Placement:
    name = ""
    summary = ""

    def health(self) -> tuple[bool, str]:
        """Whether this placement can be used here, and why not."""
        raise NotImplementedError

    def channel(self) -> tuple[socket.socket, socket.socket]:
        """The transport to a sandbox's agent: (the caller's end, the agent's end).
        The framed protocol of :mod:`corral.sandbox` runs over it unchanged."""
        raise NotImplementedError


class Local(Placement):
    name = "local"
    summary = "this machine; the agent is reached over a socket pair"

    def health(self) -> tuple[bool, str]:
        return True, "this machine"

    def channel(self) -> tuple[socket.socket, socket.socket]:
        return socket.socketpair()


class Ray(Placement):
    name = "ray"
    summary = "a node of a Ray cluster (corral batch --ray ADDRESS)"

    def __init__(self, address: str = "auto") -> None:
        self.address = address

    def health(self) -> tuple[bool, str]:
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            return False, "the ray package is not installed (pip install 'corral[ray]')"
        return True, "ray is installed; corral batch --ray ADDRESS places jobs on its nodes"

    def channel(self) -> tuple[socket.socket, socket.socket]:
        # A long-lived Sandbox is driven frame by frame; over Ray, jobs are whole
        # runs (corral.batch) and no per-frame transport is built yet.
        from corral.errors import RefusedError

        raise RefusedError("a long-lived Sandbox on Ray is not supported; use corral.batch")


class Kubernetes(Placement):
    name = "kubernetes"
    summary = "a Kubernetes pod"

    def health(self) -> tuple[bool, str]:
        import os

        kubeconfig = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
        found = "kubeconfig found" if os.path.exists(kubeconfig) else "no kubeconfig"
        return False, (
            f"corral places no pods itself; corral k8s render prints manifests to apply; "
            f"host: {found}"
        )

    def channel(self) -> tuple[socket.socket, socket.socket]:
        from corral.errors import RefusedError

        raise RefusedError("the kubernetes placement is not built yet")


def names() -> list[str]:
    return ["local", "ray", "kubernetes"]


def get(name: str) -> Placement:
    if name == "local":
        return Local()
    if name == "ray":
        return Ray()
    if name == "kubernetes":
        return Kubernetes()
    raise ValueError(f"unknown placement {name!r} ({', '.join(names())})")
