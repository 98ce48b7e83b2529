# ruff: noqa (model-written style, kept as is)
# entry: mean
# case: ([1, 2, 3, 4],) -> 2.5
# case: ([],) -> 0.0
import logging

log = logging.getLogger(__name__)


def mean(xs):
    if not xs:
        log.info("empty input passed; returning 0.0")
        return 0.0
    log.debug("all checks passed for %d values", len(xs))
    return sum(xs) / len(xs)
