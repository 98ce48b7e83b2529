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
interpreter** (the "candidate process"): its stdio point at /dev/null, it
talks to the harness over two pipes, and ``RLIMIT_NPROC = 0`` keeps it from
starting any process or thread. The candidate process loads the task's setup
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

Hacks this stops (each has a test in tests/rewards/test_code_tests.py):

- ``sys.exit(0)`` / ``os._exit(0)`` / ``raise SystemExit`` at import or inside
  the function: the verdict does not come from an exit status; a candidate
  that exits or dies fails the test it was in (all tests, at import).
- Returning an object whose ``__eq__`` is always True (or an ``int``/``str``
  subclass): only exact builtin types cross the pipe, and comparisons run in
  the harness on values it decoded itself.
- Printing ``PASSED`` / ``all tests passed``: stdout is never read (it is
  /dev/null in the candidate process).
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
import secrets
from dataclasses import dataclass, field
from typing import Any

#: Type-tagged JSON for plain data, and exact comparison. Shared by the host,
#: the harness and the candidate process (Python >= 3.8, stdlib only).
_CODEC = r'''
import base64, json

MAX_DEPTH = 200

def encode(x, depth=0):
    """Plain builtin data -> JSON-able; exact types only (a subclass is refused)."""
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    t = type(x)
    if x is None or t is bool or t is int or t is float or t is str:
        return x
    if t is list:
        return [encode(v, depth + 1) for v in x]
    if t is tuple:
        return {"t": [encode(v, depth + 1) for v in x]}
    if t is dict:
        return {"d": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in x.items()]}
    if t is set or t is frozenset:
        return {"s" if t is set else "f": [encode(v, depth + 1) for v in x]}
    if t is bytes:
        return {"b": base64.b64encode(x).decode()}
    if t is complex:
        return {"c": [x.real, x.imag]}
    raise TypeError("unsupported type " + t.__name__ + " (plain builtin data only)")

def decode(x):
    """The inverse of encode; anything else raises ValueError."""
    t = type(x)
    if x is None or t is bool or t is int or t is float or t is str:
        return x
    if t is list:
        return [decode(v) for v in x]
    if t is dict and len(x) == 1:
        (tag, v), = x.items()
        if tag == "t" and type(v) is list:
            return tuple(decode(e) for e in v)
        if tag == "d" and type(v) is list:
            return {decode(k): decode(e) for k, e in v}
        if tag == "s" and type(v) is list:
            return {decode(e) for e in v}
        if tag == "f" and type(v) is list:
            return frozenset(decode(e) for e in v)
        if tag == "b" and type(v) is str:
            return base64.b64decode(v)
        if tag == "c" and type(v) is list and len(v) == 2:
            return complex(float(v[0]), float(v[1]))
    raise ValueError("malformed value")

def same(expected, got):
    """Exact type and value, recursively, with the EXPECTED type's own __eq__."""
    t = type(expected)
    if type(got) is not t:
        return False
    if t is list or t is tuple:
        return len(got) == len(expected) and all(same(e, g) for e, g in zip(expected, got))
    if t is dict:
        return got.keys() == expected.keys() and all(same(v, got[k]) for k, v in expected.items())
    return t.__eq__(expected, got) is True
'''

#: The candidate process: loads the solution, answers call requests. Untrusted
#: once the solution is loaded; everything it sends is treated as data.
_CHILD = r"""
import os, resource

def child_main():
    rfd, wfd = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))  # no processes, no threads
    rd, wr = os.fdopen(rfd, "rb"), os.fdopen(wfd, "wb")

    def send(obj):
        wr.write(json.dumps(obj).encode() + b"\n")
        wr.flush()

    def failure(e):
        return {"ok": False, "error": type(e).__name__, "message": str(e)[:300],
                "syntax": isinstance(e, SyntaxError)}

    msg = json.loads(rd.readline())
    entry = msg["entry_point"]
    ns = {"__name__": "__solution__"}
    try:
        exec(compile(msg["setup"], "<setup>", "exec"), ns)
        stub = ns.get(entry)
        exec(compile(msg["code"], "<solution>", "exec"), ns)
        fn = ns.get(entry)
        if not callable(fn) or fn is stub:
            raise NameError("the solution does not define " + entry + "()")
    except BaseException as e:
        send(failure(e))
        return
    send({"ok": True})
    for line in rd:
        try:
            req = json.loads(line)
            value = fn(*decode(req["args"]), **decode(req["kwargs"]))
            reply = json.dumps({"ok": True, "value": encode(value)})
        except BaseException as e:
            reply = json.dumps(failure(e))
        wr.write(reply.encode() + b"\n")
        wr.flush()

child_main()
"""

#: The trusted harness (run as the sandbox snippet). Defines `split_check`,
#: also used on the host to count a check program's tests.
_PARENT = r'''
import ast, os, select, signal, subprocess, sys, time

MAX_REPLY = 16 << 20
MAX_RESTARTS = 20

class CandidateError(BaseException):
    """A failed call; BaseException so a check's `except Exception` cannot hide it."""

class _Timeout(Exception):
    pass

class _Died(Exception):
    pass

def split_check(src, entry_point):
    """(module code without check, candidate arg name, [(step code, is_test)]).

    A test is a top-level statement of check's body with a real assert (not
    `assert True`) that names the candidate (or the entry point); the other
    statements are set-up."""
    tree = ast.parse(src)
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    if not defs or not defs[-1].args.args:
        raise ValueError("the test program defines no check(candidate) function")
    fn = defs[-1]
    def calls_check(n):
        return (isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)
                and isinstance(n.value.func, ast.Name) and n.value.func.id == "check")
    rest = [n for n in tree.body if n is not fn and not calls_check(n)]
    body = list(fn.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    callee = {fn.args.args[0].arg, entry_point}
    def is_test(node):
        nodes = list(ast.walk(node))
        return (any(isinstance(n, ast.Name) and n.id in callee for n in nodes)
                and any(isinstance(a, ast.Assert) and not isinstance(a.test, ast.Constant)
                        for a in nodes))
    steps = [(node, is_test(node)) for node in body]
    if not any(t for _, t in steps):
        steps = [(ast.If(ast.Constant(True), body or [ast.Pass()], []), True)]
    def comp(nodes):
        return compile(ast.fix_missing_locations(ast.Module(nodes, [])), "<tests>", "exec")
    return comp(rest), fn.args.args[0].arg, [(comp([n]), t) for n, t in steps]

def _nondumpable():
    try:
        import ctypes
        return ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) == 0
    except Exception:
        return False

class Candidate:
    """The candidate process, restarted on demand; every reply is untrusted data."""

    def __init__(self, req):
        self.load = (json.dumps({"setup": req["setup"], "code": req["code"],
                                 "entry_point": req["entry_point"]}) + "\n").encode()
        self.proc = None
        self.buf = b""

    def start(self, deadline):
        self.proc = subprocess.Popen([sys.executable, "-I", "-c", CHILD_SOURCE],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, close_fds=True)
        os.set_blocking(self.proc.stdin.fileno(), False)
        self.buf = b""
        return self.request(self.load, deadline)

    def request(self, data, deadline):
        try:
            self._write(data, deadline)
            line = self._readline(deadline)
        except BrokenPipeError:
            raise self._dead() from None
        try:
            reply = json.loads(line)
        except (ValueError, RecursionError):
            raise self._dead("sent a malformed reply") from None
        if type(reply) is not dict:
            raise self._dead("sent a malformed reply")
        return reply

    def _write(self, data, deadline):
        fd = self.proc.stdin.fileno()
        while data:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([], [fd], [], left)[1]:
                self.kill()
                raise _Timeout()
            data = data[os.write(fd, data[:65536]):]

    def _readline(self, deadline):
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self.kill()
                raise _Timeout()
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise self._dead()
            self.buf += chunk
            if len(self.buf) > MAX_REPLY:
                raise self._dead("sent a reply over %d bytes" % MAX_REPLY)
        line, _, self.buf = self.buf.partition(b"\n")
        return line

    def _dead(self, why=None):
        self.kill()
        rc = self.proc.returncode
        if why is None:
            why = ("was killed by signal %d" % -rc) if rc < 0 else ("exited with code %d" % rc)
        return _Died("the solution's process " + why)

    @property
    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def kill(self):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass

class Runner:
    """Calls the candidate with a per-call and a total deadline; records why calls fail."""

    def __init__(self, req):
        self.cand = Candidate(req)
        self.deadline = time.monotonic() + req["timeout"]
        self.per_call = req["test_timeout"]
        self.started = False
        self.restarts = 0
        self.load_error = self.load_kind = None
        self.kinds = []

    def _kind(self, kind):
        if kind not in self.kinds:
            self.kinds.append(kind)

    def _call_deadline(self):
        now = time.monotonic()
        if now >= self.deadline:
            self._kind("timeout")
            raise CandidateError("timeout: the time limit for all tests is used up")
        return min(self.deadline, now + self.per_call)

    def ensure_started(self):
        if self.load_error is not None:
            raise CandidateError(self.load_error)
        if self.cand.alive:
            return
        if self.started:
            self.restarts += 1
            if self.restarts > MAX_RESTARTS:
                raise CandidateError("the solution's process died too often")
        first, self.started = not self.started, True
        try:
            reply = self.cand.start(self._call_deadline())
            if reply.get("ok") is True:
                return
            msg = "%s: %s" % (reply.get("error"), reply.get("message"))
            kind = "syntax_error" if reply.get("syntax") is True else "load_error"
            if reply.get("error") in ("SystemExit", "KeyboardInterrupt"):
                kind = "exit"
            elif reply.get("error") == "MemoryError":
                kind = "memory"
        except _Timeout:
            msg, kind = "timeout: loading the solution took over %gs" % self.per_call, "timeout"
        except _Died as e:
            msg, kind = str(e) + " while loading", "exit"
        self.cand.kill()
        if first:  # the solution itself fails to load: every test fails
            self.load_error, self.load_kind = msg, kind
        self._kind(kind)
        raise CandidateError(msg)

    def call(self, args, kwargs):
        self.ensure_started()
        data = (json.dumps({"args": encode(list(args)), "kwargs": encode(kwargs)}) + "\n")
        try:
            reply = self.cand.request(data.encode(), self._call_deadline())
        except _Timeout:
            self._kind("timeout")
            raise CandidateError("timeout: no answer within %gs" % self.per_call) from None
        except _Died as e:
            self._kind("crash")
            raise CandidateError(str(e)) from None
        if reply.get("ok") is True:
            try:
                return decode(reply.get("value"))
            except Exception:
                raise CandidateError("the solution returned a malformed value") from None
        if reply.get("error") == "MemoryError":
            self._kind("memory")
        raise CandidateError("%s: %s" % (reply.get("error"), reply.get("message")))

def _error_text(e):
    if isinstance(e, CandidateError):
        return str(e)
    if isinstance(e, AssertionError):
        return "AssertionError"  # its message may quote expected values
    return "%s: %s" % (type(e).__name__, str(e)[:200])

def run_cases(runner, cases):
    results = []
    for i, case in enumerate(cases):
        name = case.get("name") or "test_%d" % (i + 1)
        if runner.load_error is not None:
            results.append({"name": name, "passed": False, "error": runner.load_error})
            continue
        try:
            got = runner.call(decode(case["args"]), decode(case.get("kwargs", {"d": []})))
            error = None if same(decode(case["expected"]), got) else "wrong answer"
        except BaseException as e:
            error = _error_text(e)
        results.append({"name": name, "passed": error is None, "error": error})
    return results

def run_check(runner, req):
    module, argname, steps = split_check(req["check"], req["entry_point"])
    if runner.load_error is not None:  # run nothing: a check may pass without the candidate
        n = sum(1 for _, is_test in steps if is_test)
        return [{"name": "check_%d" % (i + 1), "passed": False, "error": runner.load_error}
                for i in range(n)]
    ns = {"__name__": "__tests__"}
    exec(compile(req["setup"], "<setup>", "exec"), ns)  # trusted: e.g. the prompt's helpers
    exec(module, ns)

    def candidate(*args, **kwargs):
        return runner.call(args, kwargs)

    candidate.__name__ = req["entry_point"]
    # As in HumanEval's own runner, where the solution's function is a global
    # of the test program (some checks call it by name).
    ns[argname] = ns[req["entry_point"]] = candidate
    results, pending = [], None
    for code, is_test in steps:
        if is_test and pending is not None:  # a failed set-up line fails the next test
            error, pending = pending, None
        else:
            try:
                exec(code, ns)
                error = None
            except BaseException as e:
                error = _error_text(e)
        if is_test:
            name = "check_%d" % (len(results) + 1)
            results.append({"name": name, "passed": error is None, "error": error})
        elif error is not None:
            pending = error
    if pending is not None and results:
        results[-1].update(passed=False, error=pending)
    return results

def main():
    nondumpable = _nondumpable()  # before the secrets arrive
    req = json.loads(sys.stdin.buffer.read())
    nonce = req.pop("nonce")
    sys.path[:] = [p for p in sys.path if p not in ("", ".", os.getcwd())]
    runner = Runner(req)
    try:
        runner.ensure_started()
    except CandidateError:
        pass
    if "cases" in req:
        results = run_cases(runner, req["cases"])
    else:
        results = run_check(runner, req)
    runner.cand.kill()  # nothing untrusted runs once the verdict is written
    verdict = {"results": results, "load_error": runner.load_error, "load_kind": runner.load_kind,
               "kinds": runner.kinds, "restarts": runner.restarts, "nondumpable": nondumpable}
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open("result-%s.json" % nonce, flags, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(verdict, f)
'''

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
    res = await sandbox.arun_python(HARNESS, stdin=json.dumps(request), collect=[result_file])
    common = {"duration_s": res.duration_s}
    raw = res.files.get(result_file)
    if raw is None:
        if res.timed_out:
            return _failed(names, "the sandbox timed out", "timeout", timed_out=True, **common)
        detail = res.error or (res.stderr.strip().splitlines() or ["no output"])[-1]
        why = f"the test harness gave no verdict (exit {res.exit_code}): {detail}"
        return _failed(names, why, "sandbox_error" if res.error else "no_result", **common)
    verdict = json.loads(raw)
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
        **common,
    )
