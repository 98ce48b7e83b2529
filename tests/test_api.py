"""The Python API: `temper.train(config, reward_funcs=[fn], dataset=rows)`."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

import temper
from temper.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def _example():
    spec = importlib.util.spec_from_file_location(
        "python_api_example", ROOT / "examples" / "python_api" / "train.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_import_temper_stays_light():
    code = "import sys, temper; print('torch' in sys.modules, 'temper.api' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "False"], out.stderr


def test_functions_become_python_components(tmp_path):
    cfg = temper.prepare_config(
        {"run": {"output_dir": str(tmp_path)}},
        reward_funcs=[json.dumps, lambda prompts, completions, **kw: [0.0] * len(completions)],
        reward_weights=[1.0, 0.5],
    )
    first, second = cfg.reward.components
    assert (first.type, first.function, first.weight) == ("python", "json:dumps", 1.0)
    # A lambda cannot be imported by path: it is referenced in this process.
    assert second.function.startswith("temper.api:registered.") and second.weight == 0.5
    from temper.rewards.trl_adapter import load_reward_function

    assert load_reward_function(second.function)([], ["a", "b"]) == [0.0, 0.0]


def test_a_process_local_function_is_refused_by_remote_backends(tmp_path):
    with pytest.raises(ConfigError, match="cannot be imported by another process"):
        temper.prepare_config(
            {"orchestrator": {"backend": "process"}},
            reward_funcs=[lambda prompts, completions, **kw: [0.0] * len(completions)],
        )


def test_dataset_objects_are_written_for_the_run(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [{"q": f"What is {i} + 1?", "a": str(i + 1)} for i in range(6)]
    cfg = temper.prepare_config(
        {"run": {"output_dir": str(tmp_path), "name": "r"}, "data": {"prompt_field": "q"}},
        dataset=rows,
        eval_dataset=datasets.Dataset.from_list(rows[:2]),
    )
    folder = tmp_path / "r.data"
    assert cfg.data.type == "file" and cfg.data.path == str(folder / "train.jsonl")
    assert cfg.data.eval_path == str(folder / "eval.jsonl")
    written = [json.loads(x) for x in (folder / "train.jsonl").read_text().splitlines()]
    assert written == rows
    assert len((folder / "eval.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize(
    ("dataset", "message"),
    [
        ([], "dataset is empty"),
        ([{"prompt": "x"}, "y"], "dataset row 1 is a str, not a dict"),
        ([{"prompt": float("nan")}], "dataset row 0 is not JSON data"),
        ("rows.jsonl", "must be a list of dicts or a datasets.Dataset"),
    ],
)
def test_bad_datasets_are_named(tmp_path, dataset, message):
    with pytest.raises(ConfigError, match=message):
        temper.prepare_config({"run": {"output_dir": str(tmp_path)}}, dataset=dataset)


def test_an_existing_run_is_refused_before_its_data_is_touched(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "metrics.jsonl").write_text("{}\n")
    (tmp_path / "r.data").mkdir()
    (tmp_path / "r.data" / "train.jsonl").write_text("kept\n")
    with pytest.raises(ConfigError, match="already exists"):
        temper.prepare_config(
            {"run": {"output_dir": str(tmp_path), "name": "r"}}, dataset=[{"prompt": "x"}]
        )
    assert (tmp_path / "r.data" / "train.jsonl").read_text() == "kept\n"


@pytest.mark.slow
def test_train_with_the_examples_function_and_rows(tmp_path):
    example = _example()
    result = temper.train(
        {
            "run": {"name": "api", "output_dir": str(tmp_path)},
            "orchestrator": {"steps": 2, "prompts_per_step": 4, "group_size": 4},
            "eval": {"every": 0, "at_start": False, "size": 4, "k": 1},
            "log": {"progress": False},
        },
        reward_funcs=[example.exact_sum, {"type": "format", "weight": 0.1}],
        dataset=example.rows(40, seed=0),
        eval_dataset=example.rows(4, seed=1),
    )
    assert result.run_dir == tmp_path / "api"
    assert result.stop_reason is None and result.interrupted_at is None
    metrics = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 2
    assert "reward/exact_sum" in metrics[0] and "reward/format" in metrics[0]
    assert result.final_eval["n_tasks"] == 4
    saved = json.loads((result.run_dir / "trajectories" / "step_000001.jsonl").open().readline())
    assert saved["prompt_text"].count("What is") == 1 and saved["answer"].isdigit()
