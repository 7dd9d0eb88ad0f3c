"""corral: a sandbox for AI agents.

Kept tiny: ``corral run`` imports this package first, so anything heavy here
would slow every sandboxed command.
"""

__version__ = "0.1.0"
