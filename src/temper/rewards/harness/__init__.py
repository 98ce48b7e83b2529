"""Source files of the code-test harness (`temper.rewards.code_tests`).

They are not imported as modules: `code_tests` reads them as text and runs them
in the sandbox (`runner.py` after `codec.py`, as one script; `candidate.py`
after `codec.py` in the candidate process). Standard library only.
"""
