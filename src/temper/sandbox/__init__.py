"""Isolated execution of untrusted code and commands, with files in and out.

`Sandbox` runs each call in a new bubblewrap sandbox; `SandboxPool` serves the
same API from pre-started warm sandboxes. Both take a `SandboxConfig` and
return a `SandboxResult`. See docs/sandbox.md for what is isolated and what is
not.
"""

from temper.sandbox.config import (
    IsolationUnavailableError,
    SandboxConfig,
    SandboxError,
    SandboxResult,
)
from temper.sandbox.pool import SandboxPool
from temper.sandbox.sandbox import Sandbox

__all__ = [
    "IsolationUnavailableError",
    "Sandbox",
    "SandboxConfig",
    "SandboxError",
    "SandboxPool",
    "SandboxResult",
]
