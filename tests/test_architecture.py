"""The house rules, checked on the source (tests/architecture_map.py reads it; run that
file to see the tables): floors, no circles, config free of runtime code, one builder,
no probing of Temper's own types, sizes."""

from __future__ import annotations

import ast

import architecture_map as house


def test_every_part_of_temper_has_a_floor():
    parts = {house.part_of(m) for m in house.modules()} - {house.FACE}
    assert parts == set(house.FLOORS)


def test_no_import_runs_up_or_across_a_floor():
    assert [f"{i.module}:{i.line} -> {i.target}" for i in house.upward_imports()] == []


def test_no_import_circles():
    assert house.circles() == []


def test_config_imports_no_runtime_code():
    config = {i.target for i in house.imports() if house.part_of(i.module) == "config"}
    assert {house.part_of(t) for t in config} <= {"config", "errors", "safe_json"}


def test_components_are_constructed_by_the_builder_only():
    assert house.misplaced_constructions() == []
    sites = house.construction_sites()
    for part, classes in house.BUILT_BY_BUILDER.items():
        for cls in classes:
            assert cls in sites, f"{cls} ({part}) is constructed nowhere in src/"


def test_builder_functions_live_in_the_builder():
    """A function that builds a component from config is named build_* and defined in
    temper.builder; the trainer's optimizer and device mesh are the trainer's own parts."""
    outside = []
    for name, path in house.modules().items():
        if house.part_of(name) == "builder":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("build_"):
                outside.append(f"{name}.{node.name}")
    assert sorted(outside) == [
        "temper.trainer.optim.build_optimizer",
        "temper.trainer.parallel.build_mesh",
    ]


def test_getattr_and_hasattr_only_on_objects_temper_does_not_define():
    """Temper's own types declare what they can do (protocols with abilities); a probe
    by name is left only for foreign objects, each file listed with what it probes."""
    listed = {file: n for file, (n, _) in house.FOREIGN_PROBES.items()}
    assert house.probes() == listed


def test_modules_and_functions_fit_the_house_rules():
    assert house.oversized() == []


def test_the_map_shows_the_floors_the_code_keeps():
    """docs/architecture.md's floor table is the one checked here."""
    doc = (house.SRC.parent / "docs" / "architecture.md").read_text()
    section = doc.split("## Floors")[1].split("\n## ")[0]
    table = next(block for block in section.split("\n\n") if block.startswith("| floor"))
    shown = {}
    for row in table.splitlines()[2:]:
        floor, parts = (cell.strip() for cell in row.strip("|").split("|"))
        shown |= {part.strip("` "): int(floor) for part in parts.split(",")}
    assert shown == house.FLOORS
