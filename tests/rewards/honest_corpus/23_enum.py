# ruff: noqa (model-written style, kept as is)
# entry: traffic_next
# case: ("red",) -> "green"
# case: ("yellow",) -> "red"
from enum import Enum


class Light(Enum):
    RED = "red"
    GREEN = "green"
    YELLOW = "yellow"


_NEXT = {Light.RED: Light.GREEN, Light.GREEN: Light.YELLOW, Light.YELLOW: Light.RED}


def traffic_next(name):
    return _NEXT[Light(name)].value
