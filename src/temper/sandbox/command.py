"""A long-lived command in a bubblewrap sandbox, for a caller that owns the process.

`Sandbox` runs a call and collects its output; some programs are servers instead,
spoken to over their pipes for a whole run or episode (an MCP server over stdio).
`SandboxedCommand(argv, config)` gives the command line that starts such a program
isolated exactly as `Sandbox` isolates code (bwrap: no network, read-only root, a
private scratch dir as /sandbox, the sandbox uid with every capability dropped,
rlimits), and removes its scratch dir at `close()`. The caller starts the process
(its pipes are the caller's); ``--die-with-parent`` ends the sandbox with it.

A Python command (``python``, ``python3`` or this interpreter) runs on the
sandbox's interpreter (`SandboxConfig.python`) with this process's import path
(site-packages, an editable checkout), bound read-only, as its ``PYTHONPATH``, so
the run's packages import inside. Arguments that name host files (a script) become
absolute paths (relative ones against ``cwd``), and their folders are bound
read-only. There is no fallback:
without working bubblewrap the constructor raises `IsolationUnavailableError`.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from collections.abc import Sequence

from temper.sandbox.bwrap import (
    launcher,
    make_scratch,
    prlimit_argv,
    probe,
    reclaim_orphans,
    remove_tree,
    sandbox_argv,
)
from temper.sandbox.config import IsolationUnavailableError, SandboxConfig, SandboxError

_PYTHONS = {"python", "python3", f"python3.{sys.version_info.minor}"}


def import_path() -> list[str]:
    """This interpreter's import path without its standard library (the sandbox's
    interpreter has its own): the folders that hold the run's packages."""
    base = {"base": sys.base_prefix, "platbase": sys.base_prefix, "installed_base": sys.base_prefix}
    stdlib = {os.path.realpath(sysconfig.get_path(k, vars=base)) for k in ("stdlib", "platstdlib")}
    dirs: list[str] = []
    for entry in sys.path:
        path = os.path.realpath(entry) if entry and os.path.isdir(entry) else None
        if path is None or path in dirs:
            continue
        under = path in stdlib or any(path.startswith(s + os.sep) for s in stdlib)
        if under and "site-packages" not in path.split(os.sep):
            continue
        dirs.append(path)
    return dirs


def _traversable(path: str) -> bool:
    """Can another uid reach ``path`` (every folder above it searchable by others)?"""
    parts = os.path.realpath(path).split(os.sep)
    for i in range(2, len(parts) + 1):
        folder = os.sep.join(parts[:i]) or os.sep
        if os.path.isdir(folder) and not os.stat(folder).st_mode & 0o001:
            return False
    return True


class SandboxedCommand:
    """``argv`` as it runs inside a sandbox of ``config``; `close()` cleans up."""

    def __init__(
        self, argv: Sequence[str], config: SandboxConfig | None = None, cwd: str | None = None
    ) -> None:
        if not argv:
            raise ValueError("SandboxedCommand needs a command")
        cfg = config or SandboxConfig()
        command, binds = list(argv), list(cfg.ro_binds)
        env = dict(cfg.env)
        is_python = os.path.basename(command[0]) in _PYTHONS or (
            os.path.realpath(command[0]) == os.path.realpath(sys.executable)
        )
        if is_python:
            command[0] = cfg.python
            path = import_path()
            binds += path
            env.setdefault("PYTHONPATH", os.pathsep.join(path))
        for i, arg in enumerate(command[1:], 1):
            host = os.path.join(cwd or os.getcwd(), arg)
            if not arg.startswith("-") and os.path.isfile(host):
                command[i] = os.path.realpath(host)
                binds.append(os.path.dirname(command[i]))
        for bind in binds:
            if not _traversable(bind):
                raise SandboxError(
                    f"sandboxed command {argv[0]!r}: {bind} is not reachable by uid {cfg.uid} "
                    "(a folder above it is private)"
                )
        self.config = cfg.model_copy(update={"ro_binds": sorted(set(binds)), "env": env})
        reclaim_orphans(self.config)
        bwrap, reason = probe(self.config)
        if bwrap is None:
            raise IsolationUnavailableError(f"cannot sandbox {argv[0]!r}: {reason}")
        self.scratch = make_scratch(self.config)
        self.argv = [
            *launcher(self.config),
            *sandbox_argv(self.config, bwrap, self.scratch),
            *prlimit_argv(self.config),
            *command,
        ]

    def close(self) -> None:
        """Remove the scratch dir (after the process has ended)."""
        remove_tree(self.scratch)
