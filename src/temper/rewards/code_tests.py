"""Run hidden unit tests against model-written Python, built to resist reward hacking.

`run_tests(sandbox, solution_code, tests, entry_point, timeout_s)` runs the
tests in a `temper.sandbox` sandbox (cold or warm pool) and returns a
`TestReport`: per-test pass/fail with an error name, and why a run failed as a
whole (syntax error, exception or exit at import, timeout, memory).

How one run works. The trusted harness (`HARNESS`, written here) is the
snippet the sandbox runs; the solution, the tests and a per-run nonce
(``secrets.token_hex``, made on the host) reach it on stdin, never in a file.
The harness makes itself non-dumpable (``prctl``), reads its stdin to the end,
and only then starts the solution in a **separate, freshly exec'd
interpreter** (the "candidate process"): it talks to the harness over two
pipes, what it prints goes to a third pipe the harness drains (keeping the
first 16 KiB as evidence, never reading a verdict from it), and
``RLIMIT_NPROC = 0`` keeps it from starting any process or thread. The candidate process loads the task's setup
code and the solution into a module namespace (``__name__ != "__main__"``),
then answers call requests: arguments in, return value out, both as
type-tagged JSON of plain builtin data (None, bool, int, float, str, bytes,
complex, list, tuple, dict, set, frozenset; exact types, no subclasses).
Expected values and test code never enter that process. The harness compares
the decoded values with the expected ones (`TestCase`: exact type and value,
recursively) or runs the HumanEval ``check(candidate)`` program itself with a
proxy ``candidate`` that forwards each call; each top-level statement of
``check`` with a real ``assert`` that names the candidate is one test. When all tests are done the harness kills
the candidate process, waits for it, and writes the verdict (JSON) to
``result-<nonce>.json``, which the host collects. A call that times out or
kills the candidate process fails that test; the process is restarted for the
next one (a solution that fails to load fails every test).

The verdict also says what the solution was seen doing (`Observed`: it
exited, returned a non-plain object, what it printed, which files it left),
the runtime evidence the code env weighs against the static hack detectors.

Hacks this stops (each has a test in tests/rewards/test_code_tests.py):

- ``sys.exit(0)`` / ``os._exit(0)`` / ``raise SystemExit`` at import or inside
  the function: the verdict does not come from an exit status; a candidate
  that exits or dies fails the test it was in (all tests, at import).
- Returning an object whose ``__eq__`` is always True (or an ``int``/``str``
  subclass): only exact builtin types cross the pipe, and comparisons run in
  the harness on values it decoded itself.
- Printing ``PASSED`` / ``all tests passed``: no verdict is ever read from
  output (what the candidate prints is kept only as evidence for
  `temper.rewards.code_hacks.confirmed`).
- Reading the tests or the expected values: they live only in the harness's
  memory (non-dumpable: its /proc/PID/{mem,fd,environ} cannot be opened) and
  were never in a file, in argv, or in the candidate's (exec'd, fresh) memory.
- Writing or forging the result file: its name holds a 128-bit nonce the
  candidate never sees; it is written only after the candidate process is
  dead, and the candidate cannot leave processes behind (``RLIMIT_NPROC=0``).
- Patching the test runner (``conftest.py``, a ``json.py`` or ``unittest.py``
  next to the code): there is no pytest, and neither interpreter imports from
  the working directory (``python -I``; the harness imports what it needs
  before the candidate runs).
- Monkeypatching builtins or the harness: the harness is another process.

Not stopped (out of reach of a test runner): a solution that special-cases
the visible inputs it is called with (it sees every argument), memorised
answers, a HumanEval ``check`` that itself has weak asserts, and the sandbox's
own limits (see docs/sandbox.md, e.g. no seccomp: a kernel exploit defeats
everything here). Killing or stopping the harness (same uid) only makes the
run fail. Only plain data crosses the pipe, so a solution that returns, say,
a generator or a custom class fails even where the original check would have
accepted it.
"""

from __future__ import annotations

import json
import logging
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temper.errors import InfraError

log = logging.getLogger("temper.rewards")
_HARNESS_DIR = Path(__file__).with_name("harness")


def _source(name: str) -> str:
    return (_HARNESS_DIR / name).read_text()


#: Type-tagged JSON for plain data and exact comparison (harness, candidate, host);
#: the candidate process's loop; the trusted harness. See `harness/`.
_CODEC = _source("codec.py")
_CHILD = _source("candidate.py")
_PARENT = _source("runner.py")

CHILD_SOURCE = _CODEC + _CHILD
HARNESS = (
    _CODEC
    + _PARENT
    + f"\nCHILD_SOURCE = {CHILD_SOURCE!r}\n\nif __name__ == '__main__':\n    main()\n"
)

# The host uses the same codec and check splitter as the harness.
_host: dict[str, Any] = {"__name__": "temper_code_harness"}
exec(compile(_CODEC + _PARENT, "<code_harness>", "exec"), _host)
encode = _host["encode"]
decode = _host["decode"]
same = _host["same"]


@dataclass(frozen=True)
class TestCase:
    """One call ``entry_point(*args, **kwargs)`` and the value it must return.

    ``args``, ``kwargs`` and ``expected`` must be plain builtin data (see the
    module doc). Passing means exactly ``expected``: same types (``True`` is
    not ``1``, a tuple is not a list), same values, recursively; floats are
    compared exactly.
    """

    __test__ = False  # not a pytest class

    args: tuple[Any, ...]
    expected: Any
    kwargs: dict[str, Any] = field(default_factory=dict)
    name: str = ""

    def to_json(self) -> dict[str, Any]:
        """A JSON-able form (type-tagged), e.g. for `Task.columns`."""
        return {
            "name": self.name,
            "args": encode(list(self.args)),
            "kwargs": encode(dict(self.kwargs)),
            "expected": encode(self.expected),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TestCase:
        return cls(
            tuple(decode(data["args"])),
            decode(data["expected"]),
            decode(data.get("kwargs", {"d": []})),
            data.get("name", ""),
        )


@dataclass
class TestResult:
    """One test: its name (``test_3``, ``check_2``), pass/fail and the error.

    ``error`` is the exception name and message of the solution's call, a
    timeout or crash message, ``"wrong answer"`` or ``"AssertionError"``; never
    the test's code or expected value.
    """

    __test__ = False

    name: str
    passed: bool
    error: str | None = None


@dataclass
class Observed:
    """What the harness saw the solution's process do: runtime evidence that
    `temper.rewards.code_hacks.confirmed` weighs against its static findings.
    It comes from untrusted behaviour, so it can only take a reward away."""

    #: It ended by itself (exit, abort, a signal it sent) or raised SystemExit /
    #: KeyboardInterrupt, while loading or in a call.
    exited: bool = False
    #: A call returned something that is not plain data (a subclass, an object).
    unplain: bool = False
    #: The first 16 KiB it printed (stdout and stderr together).
    output: str = ""
    #: Files it left in its working dir, /tmp or /dev/shm (absolute paths, <= 100).
    files: list[str] = field(default_factory=list)

    @classmethod
    def from_json(cls, data: Any) -> Observed:
        if not isinstance(data, dict):
            return cls()
        files = data.get("files")
        return cls(
            data.get("exited") is True,
            data.get("unplain") is True,
            str(data.get("output") or ""),
            [str(f) for f in files] if isinstance(files, list) else [],
        )


@dataclass
class TestReport:
    """The outcome of `run_tests`.

    ``reason`` says why tests failed beyond wrong answers: ``"syntax_error"``,
    ``"load_error"`` (an exception at import, or the entry point is missing),
    ``"exit"`` (the solution exited or died while loading), ``"timeout"``,
    ``"memory"``, ``"crash"`` (the process died during a call),
    ``"sandbox_error"`` / ``"no_result"`` (the harness gave no verdict);
    ``"failed_tests"`` when only answers were wrong; None when all passed.
    ``error`` is the load error or the sandbox's message, if any.
    """

    __test__ = False

    passed: int
    total: int
    results: list[TestResult]
    error: str | None = None
    reason: str | None = None
    timed_out: bool = False
    duration_s: float = 0.0
    restarts: int = 0
    #: What the solution was seen doing (empty when no verdict came back).
    observed: Observed = field(default_factory=Observed)

    @property
    def fraction(self) -> float:
        """Passed over total (0.0 when there are no tests)."""
        return self.passed / self.total if self.total else 0.0

    @property
    def all_passed(self) -> bool:
        return self.total > 0 and self.passed == self.total

    def summary(self, max_failures: int = 5) -> str:
        """A short failure report for the model: test names and errors only."""
        if self.all_passed:
            return f"All {self.total} tests passed."
        if self.error and not any(r.error != self.error for r in self.results if not r.passed):
            return f"Your code failed to run ({self.reason}): {self.error}"
        lines = [f"{self.passed} of {self.total} tests passed. Failures:"]
        failed = [r for r in self.results if not r.passed]
        lines += [f"- {r.name}: {r.error}" for r in failed[:max_failures]]
        if len(failed) > max_failures:
            lines.append(f"- ... and {len(failed) - max_failures} more")
        return "\n".join(lines)


def case_names(tests: list[TestCase] | str, entry_point: str = "") -> list[str]:
    """The names `run_tests` gives the tests (raises ValueError for a bad check program)."""
    if isinstance(tests, str):
        try:
            _, _, steps = _host["split_check"](tests, entry_point)
        except SyntaxError as e:
            raise ValueError(f"the test program does not compile: {e}") from None
        return [f"check_{i + 1}" for i in range(sum(t for _, t in steps))]
    return [t.name or f"test_{i + 1}" for i, t in enumerate(tests)]


def _failed(names: list[str], error: str, reason: str, **kw: Any) -> TestReport:
    results = [TestResult(n, False, error) for n in names]
    return TestReport(0, len(names), results, error, reason, **kw)


async def run_tests(
    sandbox: Any,
    solution_code: str,
    tests: list[TestCase] | str,
    entry_point: str,
    timeout_s: float = 10.0,
    *,
    test_timeout_s: float | None = None,
    setup: str = "",
) -> TestReport:
    """Run ``tests`` against ``solution_code``'s ``entry_point`` in ``sandbox``.

    ``tests`` is a list of `TestCase` or a HumanEval-style program defining
    ``check(candidate)``. ``setup`` is trusted code run before the solution in
    its namespace and before the test program in the harness's (HumanEval:
    the prompt, for its imports and helper functions). ``timeout_s`` bounds
    all tests together, ``test_timeout_s`` (default ``timeout_s``) each call;
    the harness stops at ``timeout_s``, but the sandbox's own ``timeout_s``
    still applies, so give the sandbox a second or two more. ``sandbox`` is
    a `Sandbox` or `SandboxPool` (anything with ``arun_python``).
    Never raises for anything the solution does.
    """
    names = case_names(tests, entry_point)
    nonce = secrets.token_hex(16)
    request: dict[str, Any] = {
        "nonce": nonce,
        "code": solution_code,
        "setup": setup,
        "entry_point": entry_point,
        "timeout": float(timeout_s),
        "test_timeout": float(test_timeout_s or timeout_s),
    }
    if isinstance(tests, str):
        request["check"] = tests
    else:
        request["cases"] = [t.to_json() for t in tests]
    result_file = f"result-{nonce}.json"
    try:
        res = await sandbox.arun_python(HARNESS, stdin=json.dumps(request), collect=[result_file])
    except InfraError:
        raise  # a sandbox server lost: the infrastructure's failure, not the solution's
    except Exception as e:  # the promise: nothing a solution does makes this raise
        log.warning("run_tests: the sandbox failed: %s: %s", type(e).__name__, e)
        return _failed(names, f"the sandbox failed: {e}", "sandbox_error")
    common = {"duration_s": res.duration_s}
    raw = res.files.get(result_file)
    if raw is None:
        if res.timed_out:
            return _failed(names, "the sandbox timed out", "timeout", timed_out=True, **common)
        detail = res.error or (res.stderr.strip().splitlines() or ["no output"])[-1]
        why = f"the test harness gave no verdict (exit {res.exit_code}): {detail}"
        return _failed(names, why, "sandbox_error" if res.error else "no_result", **common)
    try:
        return _report(json.loads(raw), common)
    except (ValueError, KeyError, TypeError) as e:
        why = f"the test harness wrote a malformed verdict: {type(e).__name__}"
        return _failed(names, why, "no_result", **common)


def _report(verdict: dict[str, Any], common: dict[str, Any]) -> TestReport:
    """A `TestReport` from the harness's verdict file (written by trusted code)."""
    results = [
        TestResult(str(r["name"]), r["passed"] is True, r["error"]) for r in verdict["results"]
    ]
    passed = sum(r.passed for r in results)
    kinds = verdict["kinds"]
    reason = verdict["load_kind"] or (kinds[0] if kinds else None)
    if reason is None and passed < len(results):
        reason = "failed_tests"
    return TestReport(
        passed,
        len(results),
        results,
        error=verdict["load_error"],
        reason=reason,
        timed_out="timeout" in kinds,
        restarts=int(verdict["restarts"]),
        observed=Observed.from_json(verdict.get("observed")),
        **common,
    )
