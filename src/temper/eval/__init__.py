"""Evaluation: pass@k, mean@k, greedy accuracy on held-out tasks."""

from temper.eval.harness import evaluate
from temper.eval.metrics import pass_at_k

__all__ = ["evaluate", "pass_at_k"]
