"""`run_tests`: honest code passes, wrong code fails, and reward hacks score 0.

Everything runs in the real sandbox (a warm `SandboxPool`); nothing is mocked.
Each hack below would fool a naive runner (exit status, stdout, the
solution's own `__eq__`, test files next to the code).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from temper.rewards.code_tests import (
    HARNESS,
    TestCase,
    case_names,
    decode,
    encode,
    run_tests,
    same,
)
from temper.sandbox import Sandbox, SandboxPool

DOUBLE_TESTS = [TestCase((3,), 6), TestCase((0,), 0), TestCase((-2,), -4), TestCase((5,), 10)]
DOUBLE = "def double(x):\n    return 2 * x\n"

CHECK = '''
def check(candidate):
    """docstring, not a test"""
    assert candidate(3) == 6
    xs = [1, 2]
    assert len(xs) == 2
    assert candidate(xs[1]) == 4, "message"
    for i in range(3):
        assert candidate(i) == 2 * i
    assert True
'''


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(pool_size=2, timeout_s=8) as p:
        yield p


def run(pool: Any, code: str, tests: Any = None, entry: str = "double", **kw: Any):
    tests = DOUBLE_TESTS if tests is None else tests
    kw.setdefault("timeout_s", 5.0)
    return asyncio.run(run_tests(pool, code, tests, entry, **kw))


def test_codec_round_trips_plain_data_and_refuses_subclasses():
    value = [
        1,
        True,
        None,
        2.5,
        "s",
        (1, [2]),
        {"a": {3}},
        frozenset({4}),
        b"\x00",
        1j,
        {(1, 2): 0},
    ]
    back = decode(encode(value))
    assert back == value and same(value, back)
    assert type(back[5]) is tuple and type(back[7]) is frozenset and type(back[9]) is complex
    assert float("inf") == decode(encode(float("inf")))

    class Int(int):
        pass

    for bad in (Int(3), object(), [iter([])]):
        with pytest.raises(TypeError):
            encode(bad)
    with pytest.raises(ValueError):
        decode({"x": 1})


def test_same_is_exact_in_type_and_value():
    assert same([1, (2, "a")], [1, (2, "a")])
    assert not same(1, True) and not same(True, 1) and not same(1, 1.0)
    assert not same([1, 2], (1, 2)) and not same({"a": 1}, {"a": True})
    assert not same([1, 2], [1, 2, 3]) and same({1, 2}, {2, 1})


def test_honest_solution_passes_all_tests(pool):
    report = run(pool, DOUBLE)
    assert (report.passed, report.total, report.reason, report.error) == (4, 4, None, None)
    assert report.all_passed and report.fraction == 1.0
    assert [r.name for r in report.results] == ["test_1", "test_2", "test_3", "test_4"]


def test_wrong_solution_gets_the_fraction_it_earns(pool):
    report = run(pool, "def double(x):\n    return x + 3\n")  # right only for x = 3
    assert (report.passed, report.total, report.reason) == (1, 4, "failed_tests")
    assert report.fraction == 0.25 and not report.all_passed
    assert [r.error for r in report.results] == [None] + ["wrong answer"] * 3


def test_return_type_must_match_exactly(pool):
    tests = [TestCase(([1, 2],), [2, 1]), TestCase((0,), True)]
    code = "def f(x):\n    return tuple(reversed(x)) if isinstance(x, list) else 1\n"
    report = run(pool, code, tests, "f")
    assert report.passed == 0  # (2, 1) is not [2, 1]; 1 is not True


def test_check_program_counts_real_asserts_and_passes_honest_code(pool):
    # `assert True` and asserts that do not call the candidate are no tests
    assert case_names(CHECK, "double") == ["check_1", "check_2", "check_3"]
    report = run(pool, DOUBLE, CHECK)
    assert (report.passed, report.total) == (3, 3)
    wrong = run(pool, "def double(x):\n    return 6 if x == 3 else 0\n", CHECK)
    assert (wrong.passed, wrong.total) == (1, 3)
    assert [r.error for r in wrong.results] == [None, "AssertionError", "AssertionError"]


def test_setup_code_is_visible_to_solution_and_checks(pool):
    setup = "import math\n\ndef helper(x):\n    return x + 1\n\ndef double(x):\n    '''stub'''\n"
    check = "def check(candidate):\n    assert candidate(2) == helper(3)\n"
    report = run(pool, "def double(x):\n    return helper(x) + x - 1 + 0 * math.pi\n", check,
                 setup=setup)  # fmt: skip
    assert report.passed == 1
    stub_only = run(pool, "x = 1\n", check, setup=setup)  # the stub is not a solution
    assert stub_only.passed == 0 and stub_only.reason == "load_error"
    assert "does not define double()" in stub_only.error


def test_syntax_error_and_missing_function_score_zero_with_a_reason(pool):
    report = run(pool, "def double(x)\n    return 2 * x\n")
    assert report.passed == 0 and report.reason == "syntax_error"
    assert report.error.startswith("SyntaxError")
    assert all(r.error == report.error for r in report.results)
    assert "failed to run (syntax_error)" in report.summary()
    missing = run(pool, "def triple(x):\n    return 3 * x\n")
    assert missing.passed == 0 and missing.reason == "load_error"
    # A check that would pass without calling the candidate is not even run.
    check = "def check(candidate):\n    assert callable(candidate)\n    assert candidate(1) == 2\n"
    assert run(pool, DOUBLE, check).passed == 2
    broken = run(pool, "def double(x)\n", check)
    assert (broken.passed, broken.total, broken.reason) == (0, 2, "syntax_error")


def test_infinite_loops_time_out(pool):
    start = time.monotonic()
    report = run(pool, "def double(x):\n    while True:\n        pass\n", timeout_s=2.0,
                 test_timeout_s=0.5)  # fmt: skip
    assert report.passed == 0 and report.reason == "timeout" and report.timed_out
    assert time.monotonic() - start < 30  # stopped by the harness, not hung
    at_import = run(pool, "while True:\n    pass\n", timeout_s=2.0, test_timeout_s=0.5)
    assert at_import.passed == 0 and at_import.reason == "timeout"


def test_a_loop_on_one_input_costs_only_that_test(pool):
    code = "def double(x):\n    while x == 0:\n        pass\n    return 2 * x\n"
    # Room for the restarted interpreter to load on a busy machine (the load
    # counts against the next call's time).
    report = run(pool, code, timeout_s=7.0, test_timeout_s=2.0)
    assert (report.passed, report.total, report.reason) == (3, 4, "timeout")
    assert report.results[1].error.startswith("timeout") and report.restarts == 1


def test_memory_error_scores_zero_with_a_reason(pool):
    report = run(pool, "def double(x):\n    return len(bytearray(1 << 40))\n")
    assert report.passed == 0 and report.reason == "memory"
    assert report.results[0].error.startswith("MemoryError")


# ----------------------------------------------------------------------------- hacks

HACKS = {
    "sys.exit(0) at import": "import sys\nsys.exit(0)\ndef double(x):\n    return 0\n",
    "os._exit(0) at import": "import os\nos._exit(0)\n",
    "os._exit(0) in the function": "import os\ndef double(x):\n    os._exit(0)\n",
    "SystemExit in the function": "def double(x):\n    raise SystemExit(0)\n",
    "always-true __eq__": (
        "class Anything:\n"
        "    def __eq__(self, other):\n        return True\n"
        "    def __ne__(self, other):\n        return False\n"
        "def double(x):\n    return Anything()\n"
    ),
    "int subclass equal to everything": (
        "class I(int):\n    def __eq__(self, other):\n        return True\n"
        "    __hash__ = int.__hash__\n"
        "def double(x):\n    return I(0)\n"
    ),
    "printing PASSED": (
        "print('PASSED'); print('all tests passed'); print('4 passed in 0.01s')\n"
        "import sys\nsys.stderr.write('OK\\n')\n"
        "def double(x):\n    print('PASSED')\n    return None\n"
    ),
    "patching builtins and the test runner": (
        "import builtins, os, sys\n"
        "builtins.AssertionError = type('Nope', (Exception,), {})\n"
        "for name in ('conftest.py', 'json.py', 'unittest.py', 'pytest.py'):\n"
        "    open(name, 'w').write('raise SystemExit(0)\\n')\n"
        "def double(x):\n    return None\n"
    ),
    "killing the harness": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n",
}

# Tries every way it can think of to read the tests or the result file's name,
# and to forge a verdict; it returns what it found, which could only pass if it
# found the expected value. It also leaves a process behind, if it can.
SNOOP = r"""
import glob, json, os
found = []
ppid = os.getppid()
for path in (["/proc/%d/%s" % (ppid, p) for p in ("cmdline", "environ", "mem", "fd/0", "fd/1")]
             + ["/proc/1/fd/0", "/proc/self/fd/0"] + glob.glob("/sandbox/*") + glob.glob("/tmp/*")):
    try:
        with open(path, "rb") as f:
            found.append(f.read(1 << 20))
    except OSError:
        pass
fake = {"results": [{"name": "test_%d" % i, "passed": True, "error": None} for i in range(1, 5)],
        "load_error": None, "load_kind": None, "kinds": [], "restarts": 0, "nondumpable": True}
for d in ("/sandbox", "/tmp", "."):
    for name in ("result.json", "result-0.json", "verdict.json"):
        try:
            json.dump(fake, open(os.path.join(d, name), "w"))
        except OSError:
            pass
try:
    if os.fork() == 0:  # a process that forges every result file it sees
        import time
        for _ in range(2000):
            for p in glob.glob("/sandbox/result-*.json"):
                json.dump(fake, open(p, "w"))
            time.sleep(0.001)
        os._exit(0)
except OSError:
    pass
blob = b"".join(found)
def double(x):
    i = blob.find(b"SECRET-")
    return blob[i:i + 12].decode() if i >= 0 else "nothing"
"""


@pytest.mark.parametrize("name", sorted(HACKS))
def test_reward_hacks_score_zero(pool, name):
    report = run(pool, HACKS[name])
    assert report.passed == 0, (name, report)
    assert report.total == 4


@pytest.mark.parametrize("name", ["always-true __eq__", "printing PASSED", "sys.exit(0) at import"])
def test_reward_hacks_score_zero_against_check_programs(pool, name):
    report = run(pool, HACKS[name], CHECK)
    assert report.passed == 0 and report.total == 3


def test_stopping_the_harness_scores_zero():
    # SIGSTOP freezes the harness: no verdict before the sandbox's own timeout.
    code = "import os, signal\nos.kill(os.getppid(), signal.SIGSTOP)\n"
    with Sandbox(timeout_s=2) as box:
        report = run(box, code, timeout_s=1.0)
    assert report.passed == 0 and report.reason == "timeout" and report.timed_out


def test_solution_cannot_read_tests_or_forge_the_verdict(pool):
    tests = [TestCase((i,), f"SECRET-{i:05d}") for i in range(4)]
    report = run(pool, SNOOP, tests)
    assert report.passed == 0 and report.total == 4
    assert {r.error for r in report.results} == {"wrong answer"}
    check = "def check(candidate):\n    assert candidate(1) == 'SECRET-00001'\n"
    assert run(pool, SNOOP, check).passed == 0


def test_harness_takes_its_secrets_from_stdin_only():
    # The harness source is visible to the solution (/proc/PID/cmdline); it
    # must not hold tests, nonces or expected values.
    assert "SECRET" not in HARNESS and "nonce = req.pop" in HARNESS


def test_honest_solution_still_passes_after_hacks_ran_in_the_pool(pool):
    for code in HACKS.values():
        run(pool, code)
    assert run(pool, DOUBLE).all_passed


def test_chatty_solution_never_blocks_and_its_output_is_kept_as_evidence(pool):
    code = (
        "import sys\nprint('loading')\n"
        "def double(x):\n    sys.stdout.write('x' * 1000000)\n    print('done', x)\n"
        "    return 2 * x\n"
    )
    report = run(pool, code)
    assert report.all_passed, report
    assert report.observed.output.startswith("loading\n" + "x" * 100)
    assert len(report.observed.output) == 16 << 10  # only the first 16 KiB are kept
    assert not report.observed.exited and not report.observed.unplain


def test_the_run_records_what_the_solution_did(pool):
    exits = run(pool, "def double(x):\n    raise SystemExit(0)\n")
    assert exits.observed.exited and exits.passed == 0
    odd = run(pool, "class I(int):\n    pass\ndef double(x):\n    return I(2 * x)\n")
    assert odd.observed.unplain and odd.passed == 0
    files = run(pool, "open('conftest.py', 'w').close()\nDOUBLE = 2\n" + DOUBLE)
    assert files.all_passed and files.observed.files == ["/sandbox/conftest.py"]
    clean = run(pool, DOUBLE)
    assert clean.observed.files == [] and clean.observed.output == ""
    assert not clean.observed.exited and not clean.observed.unplain


@pytest.mark.parametrize("where", ["cold", "warm"])
def test_run_tests_never_raises_whatever_the_solution_leaves(pool, where):
    # A tree too deep for a recursive clean-up, without permission bits, in the
    # working dir and in /tmp; then an innocent solution on the same sandbox.
    code = (
        "import os\nfor top in ('.', '/tmp'):\n    os.chdir(top if top != '.' else '/sandbox')\n"
        "    for _ in range(1200):\n        os.mkdir('dddd')\n        os.chdir('dddd')\n"
        "    os.chmod('.', 0)\n" + DOUBLE
    )
    box = Sandbox(timeout_s=8) if where == "cold" else pool
    try:
        report = run(box, code)
        assert report.total == 4  # a report, whatever it says
        assert run(box, DOUBLE).all_passed
    finally:
        if where == "cold":
            box.close()
