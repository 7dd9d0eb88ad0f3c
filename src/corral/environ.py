"""The sandbox's environment and working directory, from the policy.

The launcher's environment is not inherited.  Values reach the sandbox through
the environment block of ``execve`` only, never through argv, where any user
on the host could read them in ``/proc/PID/cmdline``.
"""

from __future__ import annotations

import os

from corral import defaults

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from corral.policy import Policy


def sandbox_env(policy: Policy, source: Mapping[str, str] | None = None) -> dict[str, str]:
    src = os.environ if source is None else source
    env: dict[str, str] = {}
    for name in (*defaults.BASE_ENV, *defaults.CA_ENV, *policy.env.pass_names):
        value = src.get(name)
        if value is not None:
            env[name] = value
    env.setdefault("PATH", defaults.FALLBACK_PATH)
    env.setdefault("HOME", policy.home())
    for name, value in defaults.INSTALLER_ENV.items():
        env.setdefault(name, value)
    env.update(policy.env.set_values)
    env["CORRAL_SANDBOX"] = "1"  # lets tools (and tests) know where they run
    return env


def sandbox_cwd(policy: Policy, writable: list[str], here: str | None = None) -> str:
    """The caller's cwd (``here``, symlinks resolved; read now when None) if it is
    inside a writable path, else the workspace."""
    if here is None:
        try:
            here = os.path.realpath(os.getcwd())
        except OSError:
            return policy.workspace
    if not here:
        return policy.workspace
    for root in writable:
        if here == root or here.startswith(root.rstrip("/") + "/"):
            return here
    return policy.workspace
