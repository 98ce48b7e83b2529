"""Pull final answers out of text: GSM8K's `#### N` and LaTeX `\\boxed{...}`.

Used for gold answers when a dataset is loaded (`temper.data.datasets`) and by the
math rewards. Pure string functions, no imports beyond the standard library.
"""

from __future__ import annotations

import re

_GSM8K_MARK = "####"
_NUMBER_WITH_COMMAS = re.compile(r"[-+]?\d{1,3}(,\d{3})+(\.\d+)?")
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")


def extract_gsm8k_answer(text: str) -> str | None:
    """Return the final answer after the last `####` of a GSM8K solution, or None.

    Thousands separators are removed from numbers: `"... #### 1,450,000"` gives
    `"1450000"`; `"#### 72"` gives `"72"`.
    """
    if _GSM8K_MARK not in text:
        return None
    answer = text.rsplit(_GSM8K_MARK, 1)[1].strip()
    if _NUMBER_WITH_COMMAS.fullmatch(answer):
        answer = answer.replace(",", "")
    return answer or None


def find_last_boxed(text: str) -> tuple[str, int, int] | None:
    """Locate the last `\\boxed{...}` (or `\\fbox{...}`) with balanced braces.

    Returns `(content, start, end)` where `text[start:end]` is the whole
    `\\boxed{...}` expression, or None when there is no complete one.
    """
    for match in reversed(list(_BOXED.finditer(text))):
        depth = 1
        pos = match.end()
        while pos < len(text):
            char = text[pos]
            if char == "{":
                depth += 1
            elif char == "}":
                depth -= 1
                if depth == 0:
                    return text[match.end() : pos], match.start(), pos + 1
            pos += 1
    return None


def extract_boxed(text: str) -> str | None:
    """Return the content of the last `\\boxed{...}` in `text`, or None.

    `"so \\boxed{\\frac{1}{2}}."` gives `"\\frac{1}{2}"`.
    """
    found = find_last_boxed(text)
    return found[0].strip() if found else None


def normalize_gold_answer(answer: str) -> str:
    """Reduce a reference answer to the expression to compare against.

    A GSM8K solution (`... #### 72`) gives its final number; a text with a
    `\\boxed{...}` gives the boxed content; anything else is returned stripped.
    """
    gsm8k = extract_gsm8k_answer(answer)
    if gsm8k is not None:
        return gsm8k
    boxed = extract_boxed(answer)
    if boxed is not None:
        return boxed
    return answer.strip()
