"""corral: a sandbox for AI agents.

Kept tiny: ``corral run`` imports this package first, so anything heavy here
would slow every sandboxed command.
"""

__version__ = "0.1.0"

TYPE_CHECKING = False
if TYPE_CHECKING:  # the names __getattr__ hands out, typed for a user's type checker
    from corral.net.asking import AskInfo, Decision
    from corral.policy import Policy
    from corral.sandbox import AsyncSandbox, ExecResult, Process, Sandbox, SandboxError

    __all__ = [
        "AskInfo",
        "AsyncSandbox",
        "Decision",
        "ExecResult",
        "Policy",
        "Process",
        "Sandbox",
        "SandboxError",
    ]


def __getattr__(name: str) -> object:
    """``from corral import Sandbox, Policy``, imported only when asked for."""
    if name in ("Sandbox", "AsyncSandbox", "ExecResult", "Process", "SandboxError"):
        from corral import sandbox

        return getattr(sandbox, name)
    if name in ("Decision", "AskInfo"):  # Sandbox(on_ask=...)'s question and answer
        from corral.net import asking

        return getattr(asking, name)
    if name == "Policy":
        from corral.policy import Policy

        return Policy
    raise AttributeError(f"module 'corral' has no attribute {name!r}")
