"""Sandbox settings, the result of one execution, and the errors.

`SandboxConfig` is a pydantic model: every field is documented and bounded, and
unknown keys are errors. `SandboxResult` is what every run returns, whether it
ran cold, in the warm pool or in the rlimits-only fallback.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field, field_validator

from temper.errors import TemperError

#: Where untrusted code runs, inside the sandbox (a host temp dir bound read-write).
WORKDIR = "/sandbox"

#: stderr substrings that mark a failed allocation (see `SandboxResult.memory_exceeded`).
MEMORY_MARKERS = (
    "MemoryError",
    "Cannot allocate memory",
    "std::bad_alloc",
    "out of memory",
)


def default_python() -> str:
    """The interpreter used inside the sandbox: a system ``python3`` under /usr when
    there is one (bound read-only with /usr), else the host's base interpreter.

    The sandbox starts as an unprivileged uid, so the interpreter must be on a
    path that uid can traverse: a pyenv under /root, for example, is not.
    """
    found = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
    return found or os.path.realpath(getattr(sys, "_base_executable", sys.executable))


class SandboxError(TemperError):
    """A sandbox could not be used as configured."""


class IsolationUnavailableError(SandboxError):
    """bubblewrap is missing or cannot start here, and the config forbids the
    rlimits-only fallback (``allow_fallback=False``)."""


class SandboxConfig(BaseModel):
    """How untrusted code is run: isolation, resource limits and the warm pool."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout_s: float = Field(
        10.0, gt=0, le=3600, description="Wall-clock limit; the whole process tree is killed."
    )
    cpu_s: int = Field(
        10, ge=1, le=3600, description="RLIMIT_CPU per process (SIGXCPU, then SIGKILL 1 s later)."
    )
    memory_mb: int = Field(
        1024, ge=16, le=1 << 20, description="RLIMIT_AS per process: virtual address space."
    )
    fsize_mb: int = Field(
        64, ge=1, le=1 << 20, description="RLIMIT_FSIZE: largest file a process may write."
    )
    tmpfs_mb: int = Field(
        64, ge=1, le=1 << 16, description="Size of each of the sandbox's /tmp and /dev/shm."
    )
    nproc: int = Field(
        64,
        ge=4,
        le=1 << 16,
        description="RLIMIT_NPROC: processes of the sandbox uid, counted per user namespace "
        "(so per sandbox) on Linux >= 5.14; host-wide for that uid in the fallback.",
    )
    nofile: int = Field(256, ge=16, le=1 << 20, description="RLIMIT_NOFILE: open files.")
    max_output_bytes: int = Field(
        1 << 20, ge=0, le=1 << 30, description="Bytes kept of each of stdout and stderr."
    )
    max_file_bytes: int = Field(
        16 << 20, ge=0, le=1 << 30, description="Largest file returned by `collect`."
    )
    allow_fallback: bool = Field(
        True,
        description="Without working bubblewrap, run with rlimits only (logs a warning once); "
        "False raises IsolationUnavailableError instead.",
    )
    bwrap: str = Field("bwrap", description="The bubblewrap binary (a name on PATH or a path).")
    python: str = Field(
        default_factory=default_python,
        description="Interpreter for run_python, as seen inside the sandbox.",
    )
    uid: int = Field(65534, ge=1, description="Uid the code runs as (nobody); see docs.")
    gid: int = Field(65534, ge=1, description="Gid the code runs as (nogroup).")
    ro_binds: list[str] = Field(
        default_factory=list,
        description="Extra host paths bound read-only at the same place (e.g. a venv).",
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="Extra environment variables (the rest is cleared)."
    )
    scratch_root: str | None = Field(
        None, description="Host folder for scratch dirs; None is the system temp dir."
    )
    pool_size: int = Field(4, ge=1, le=512, description="Warm workers kept ready by a pool.")
    pool_max_uses: int = Field(
        100,
        ge=1,
        le=1 << 20,
        description="Requests a warm worker serves before it is replaced; 1 gives every "
        "request a brand-new sandbox.",
    )
    max_concurrency: int = Field(
        64, ge=1, le=4096, description="Threads serving the async API (`arun`)."
    )

    @field_validator("ro_binds")
    @classmethod
    def _absolute(cls, paths: list[str]) -> list[str]:
        for p in paths:
            if not os.path.isabs(p):
                raise ValueError(f"ro_binds entry {p!r} is not an absolute path")
        return paths

    def limits(self) -> dict[str, int]:
        """The rlimits as `_server.apply_limits` takes them."""
        return {
            "cpu": self.cpu_s,
            "as": self.memory_mb << 20,
            "fsize": self.fsize_mb << 20,
            "nproc": self.nproc,
            "nofile": self.nofile,
        }


@dataclass
class SandboxResult:
    """The outcome of one execution.

    ``exit_code`` is the shell convention: the exit status, or 128+N when the
    process was killed by signal N (SIGXCPU at the CPU limit gives 152); it is
    None when the run timed out (we killed it) or never ran (see ``error``).

    ``memory_exceeded`` is a diagnosis, not an attestation: True when the run did
    not time out, exited non-zero, and its stderr contains one of
    `MEMORY_MARKERS` ("MemoryError", the ENOMEM message "Cannot allocate
    memory", "std::bad_alloc", "out of memory"), which is how an allocation
    refused under RLIMIT_AS shows up in Python, C and C++ programs. Code can
    set it for its own run by printing a marker; a program that crashes
    silently on a failed allocation (e.g. SIGSEGV) is not caught.
    """

    stdout: str
    stderr: str
    exit_code: int | None
    timed_out: bool = False
    memory_exceeded: bool = False
    duration_s: float = 0.0
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    #: Collected files by the relative path asked for.
    files: dict[str, bytes] = field(default_factory=dict)
    #: Asked-for paths not returned: absent, not a regular file, a symlink, or too big.
    missing_files: list[str] = field(default_factory=list)
    #: False when the run used the rlimits-only fallback.
    isolated: bool = True
    #: Why the run could not complete normally (worker died, protocol error).
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Exited 0 within the time limit."""
        return self.exit_code == 0 and not self.timed_out

    @classmethod
    def from_output(
        cls,
        out: bytes,
        err: bytes,
        exit_code: int | None,
        timed_out: bool,
        duration_s: float,
        out_truncated: bool,
        err_truncated: bool,
        **extra,
    ) -> SandboxResult:
        """Decode the streams (UTF-8, invalid bytes replaced) and diagnose memory."""
        stderr = err.decode("utf-8", "replace")
        memory = (
            not timed_out
            and exit_code not in (0, None)
            and any(m in stderr for m in MEMORY_MARKERS)
        )
        return cls(
            stdout=out.decode("utf-8", "replace"),
            stderr=stderr,
            exit_code=exit_code,
            timed_out=timed_out,
            memory_exceeded=memory,
            duration_s=duration_s,
            stdout_truncated=out_truncated,
            stderr_truncated=err_truncated,
            **extra,
        )
