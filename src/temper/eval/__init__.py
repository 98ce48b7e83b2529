"""temper.eval: greedy accuracy, pass@k and mean@k on held-out tasks.

`harness.py` (`evaluate` over any rollout source; by category, with Wilson
intervals), `metrics.py` (unbiased pass@k), `suites.py` (what each ``temper eval
--suite`` is and checks before a model loads; prompts that do not fit count as
wrong), `bfcl.py` (the BFCL data and env), `report.py` (the table ``temper eval``
prints). Suites are built in `temper.builder.suites`. See docs/eval.md.
"""

from temper.eval.harness import evaluate
from temper.eval.metrics import pass_at_k

__all__ = ["evaluate", "pass_at_k"]
