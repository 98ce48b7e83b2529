# ruff: noqa (model-written style, kept as is)
# entry: sort_people
# case: ([["bob", 30], ["amy", 25], ["cat", 30]],) -> ["amy", "bob", "cat"]
from dataclasses import dataclass, field


@dataclass(order=True, frozen=True)
class Person:
    age: int
    name: str = field(compare=True)


def sort_people(rows):
    people = sorted(Person(age, name) for name, age in rows)
    return [p.name for p in people]
