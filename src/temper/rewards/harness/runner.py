"""The trusted harness run as the sandbox snippet (after codec.py, as one script)."""

# ruff: noqa
import ast, os, select, signal, subprocess, sys, threading, time

MAX_REPLY = 16 << 20
MAX_RESTARTS = 20
#: Bytes kept of what the solution prints (evidence for the hack detectors).
OUTPUT_CAP = 16 << 10
#: Entries looked at, and depth, when listing the files a solution left.
MAX_LISTED, MAX_DEPTH_LISTED = 2000, 3


class CandidateError(BaseException):
    """A failed call; BaseException so a check's `except Exception` cannot hide it."""


class _Timeout(Exception):
    pass


class _Died(Exception):
    def __init__(self, message, own):
        super().__init__(message)
        self.own = own  # the process ended by itself (exit, abort, a signal it sent)


class Output:
    """Drains the candidate processes' output pipe on a thread, keeping the first
    OUTPUT_CAP bytes, so a solution that prints never blocks and nothing it
    prints is read as a verdict."""

    def __init__(self):
        self.r, self.w = os.pipe()
        self.data = bytearray()
        self.thread = threading.Thread(target=self._drain, daemon=True)
        self.thread.start()

    def _drain(self):
        while True:
            try:
                chunk = os.read(self.r, 1 << 16)
            except OSError:
                return
            if not chunk:
                return
            room = OUTPUT_CAP - len(self.data)
            if room > 0:
                self.data += chunk[:room]

    def text(self):
        """What was printed; call once every candidate process is dead."""
        os.close(self.w)
        self.thread.join(2.0)
        return bytes(self.data[:OUTPUT_CAP]).decode("utf-8", "replace")


def list_files(tops):
    """Paths below ``tops`` (at most MAX_LISTED, MAX_DEPTH_LISTED deep; links not
    followed), to see which files a solution left."""
    seen, queue = set(), [(top, 0) for top in tops]
    while queue and len(seen) < MAX_LISTED:
        path, depth = queue.pop()
        try:
            with os.scandir(path) as it:
                for entry in it:
                    seen.add(entry.path)
                    if depth < MAX_DEPTH_LISTED and entry.is_dir(follow_symlinks=False):
                        queue.append((entry.path, depth + 1))
                    if len(seen) >= MAX_LISTED:
                        break
        except OSError:
            continue
    return seen


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
        return (
            isinstance(n, ast.Expr)
            and isinstance(n.value, ast.Call)
            and isinstance(n.value.func, ast.Name)
            and n.value.func.id == "check"
        )

    rest = [n for n in tree.body if n is not fn and not calls_check(n)]
    body = list(fn.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    callee = {fn.args.args[0].arg, entry_point}

    def is_test(node):
        nodes = list(ast.walk(node))
        return any(isinstance(n, ast.Name) and n.id in callee for n in nodes) and any(
            isinstance(a, ast.Assert) and not isinstance(a.test, ast.Constant) for a in nodes
        )

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

    def __init__(self, req, output):
        self.output = output
        self.load = (
            json.dumps(
                {"setup": req["setup"], "code": req["code"], "entry_point": req["entry_point"]}
            )
            + "\n"
        ).encode()
        self.proc = None
        self.buf = b""

    def start(self, deadline):
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-c", CHILD_SOURCE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.output.w,
            close_fds=True,
        )
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
            data = data[os.write(fd, data[:65536]) :]

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
        own = why is None
        if own:  # its pipe closed: did it exit by itself, or just close the pipe?
            try:
                self.proc.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                own = False
        self.kill()
        rc = self.proc.returncode
        if why is None:
            why = ("was killed by signal %d" % -rc) if rc < 0 else ("exited with code %d" % rc)
        return _Died("the solution's process " + why, own)

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

    def __init__(self, req, output):
        self.cand = Candidate(req, output)
        self.deadline = time.monotonic() + req["timeout"]
        self.per_call = req["test_timeout"]
        self.started = False
        self.restarts = 0
        self.load_error = self.load_kind = None
        self.kinds = []
        # Runtime evidence for the static hack detectors (temper.rewards.code_hacks).
        self.exited = self.unplain = False

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
                kind, self.exited = "exit", True
            elif reply.get("error") == "MemoryError":
                kind = "memory"
        except _Timeout:
            msg, kind = "timeout: loading the solution took over %gs" % self.per_call, "timeout"
        except _Died as e:
            msg, kind = str(e) + " while loading", "exit"
            self.exited = self.exited or e.own
        self.cand.kill()
        if first:  # the solution itself fails to load: every test fails
            self.load_error, self.load_kind = msg, kind
        self._kind(kind)
        raise CandidateError(msg)

    def call(self, args, kwargs):
        self.ensure_started()
        data = json.dumps({"args": encode(list(args)), "kwargs": encode(kwargs)}) + "\n"
        try:
            reply = self.cand.request(data.encode(), self._call_deadline())
        except _Timeout:
            self._kind("timeout")
            raise CandidateError("timeout: no answer within %gs" % self.per_call) from None
        except _Died as e:
            self._kind("crash")
            self.exited = self.exited or e.own
            raise CandidateError(str(e)) from None
        if reply.get("ok") is True:
            try:
                return decode(reply.get("value"))
            except Exception:
                raise CandidateError("the solution returned a malformed value") from None
        if reply.get("error") == "MemoryError":
            self._kind("memory")
        elif reply.get("error") in ("SystemExit", "KeyboardInterrupt"):
            self.exited = True
        self.unplain = self.unplain or reply.get("unplain") is True
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
        return [
            {"name": "check_%d" % (i + 1), "passed": False, "error": runner.load_error}
            for i in range(n)
        ]
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
    tops = (os.getcwd(), "/tmp", "/dev/shm")
    files_before = list_files(tops)
    output = Output()
    runner = Runner(req, output)
    try:
        runner.ensure_started()
    except CandidateError:
        pass
    if "cases" in req:
        results = run_cases(runner, req["cases"])
    else:
        results = run_check(runner, req)
    runner.cand.kill()  # nothing untrusted runs once the verdict is written
    observed = {
        "exited": runner.exited,
        "unplain": runner.unplain,
        "output": output.text(),
        "files": sorted(list_files(tops) - files_before)[:100],
    }
    verdict = {
        "observed": observed,
        "results": results,
        "load_error": runner.load_error,
        "load_kind": runner.load_kind,
        "kinds": runner.kinds,
        "restarts": runner.restarts,
        "nondumpable": nondumpable,
    }
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open("result-%s.json" % nonce, flags, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(verdict, f)
