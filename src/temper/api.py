"""The Python API: train with function objects and dataset objects.

    import temper

    def exact(prompts, completions, answer, **kwargs):
        return [1.0 if a in c else 0.0 for c, a in zip(completions, answer)]

    result = temper.train(
        {"run": {"name": "mine"}, "orchestrator": {"steps": 20}},
        reward_funcs=[exact, {"type": "format", "weight": 0.1}],
        dataset=[{"prompt": "What is 2 + 2?", "answer": "4"}, ...],
    )
    print(result.run_dir, result.final_eval["accuracy"])

It is the same run as `temper train`: the config is the same schema, and the
objects passed here become config entries. A dataset (a list of dicts, a
Hugging Face `datasets.Dataset`, or any iterable of mappings) is written to
`<output_dir>/<name>.data/train.jsonl` (and `eval.jsonl`) beside the run
directory, so the run's config.toml names real files and `temper eval
--checkpoint`, `temper replay` and resuming work on the run later. A reward
function becomes a `type = "python"` component: by its import path when it is
importable (a module-level function), else by a reference valid in this process
only (a lambda, a closure, a function of `__main__`), which the in-process
("local") orchestrator backend accepts and the process and Ray backends refuse.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from temper.config import Config, config_from_dict, load_config
from temper.errors import ConfigError

#: Reward functions that cannot be imported by path, for `load_reward_function`
#: ("temper.api:registered.f0"). Valid in this process only.
registered = types.SimpleNamespace()

ConfigLike = Config | Mapping[str, Any] | str | Path | None
RewardLike = Callable[..., Any] | Mapping[str, Any]


@dataclass
class TrainResult:
    """Where the run wrote its files, its last evaluation ({} when none ran), and how it ended.

    `stop_reason` is set when a health check stopped the run (`temper train` exits 3);
    `interrupted_at` is the step a Ctrl-C stopped it at (exit 130; resume with
    `run.resume`). Both None: the run finished.
    """

    run_dir: Path
    final_eval: dict[str, Any]
    stop_reason: str | None = None
    interrupted_at: int | None = None


def _config(config: ConfigLike) -> Config:
    if config is None or isinstance(config, str | Path):
        return load_config(config)
    if isinstance(config, Config):
        return config.model_copy(deep=True)
    if isinstance(config, Mapping):
        return config_from_dict(dict(config))
    raise ConfigError(
        f"config must be a Config, a dict, a TOML path or None, not {type(config).__name__}"
    )


def reward_spec(fn: Callable[..., Any]) -> tuple[str, bool]:
    """("module:qualname", True) for an importable function, else a process-local spec."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if module and module != "__main__" and "<" not in qualname:
        try:
            found: Any = importlib.import_module(module)
            for part in qualname.split("."):
                found = getattr(found, part)
        except (ImportError, AttributeError):
            found = None
        if found is fn:
            return f"{module}:{qualname}", True
    name = f"f{len(vars(registered))}"
    setattr(registered, name, fn)
    return f"{__name__}:registered.{name}", False


def _components(
    reward_funcs: Sequence[RewardLike], weights: Sequence[float] | None
) -> tuple[list[dict[str, Any]], list[str]]:
    """Config components for `reward_funcs`, and the names of the process-local ones."""
    if weights is not None and len(weights) != len(reward_funcs):
        raise ConfigError(
            f"reward_weights has {len(weights)} entries for {len(reward_funcs)} reward_funcs"
        )
    components, local = [], []
    for i, item in enumerate(reward_funcs):
        if isinstance(item, Mapping):
            component = dict(item)
        elif callable(item):
            spec, importable = reward_spec(item)
            if not importable:
                local.append(getattr(item, "__qualname__", repr(item)))
            component = {"type": "python", "function": spec}
        else:
            raise ConfigError(
                f"reward_funcs[{i}] must be a function or a component dict, "
                f"not {type(item).__name__}"
            )
        if weights is not None:
            component["weight"] = float(weights[i])
        components.append(component)
    return components, local


def write_rows(rows: Iterable[Mapping[str, Any]] | Any, path: Path, what: str) -> int:
    """Write a dataset's rows as JSON lines; returns how many. Names a row that is not JSON."""
    if hasattr(rows, "to_list") and not isinstance(rows, list):  # datasets.Dataset
        rows = rows.to_list()
    if isinstance(rows, str | bytes | Mapping) or not isinstance(rows, Iterable):
        raise ConfigError(
            f"{what} must be a list of dicts or a datasets.Dataset, not {type(rows).__name__}"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("w") as f:
        for i, row in enumerate(rows):
            if not isinstance(row, Mapping):
                raise ConfigError(f"{what} row {i} is a {type(row).__name__}, not a dict")
            try:
                f.write(json.dumps(dict(row), allow_nan=False) + "\n")
            except (TypeError, ValueError) as err:
                raise ConfigError(f"{what} row {i} is not JSON data: {err}") from None
            n += 1
    if n == 0:
        raise ConfigError(f"{what} is empty")
    return n


def _check_run_dir_free(cfg: Config) -> None:
    """Refuse before writing any dataset file, as the run itself would refuse later."""
    from temper.orchestrator.run_dir import holds_results

    path = Path(cfg.run.output_dir) / cfg.run.name
    if holds_results(path) and not (cfg.run.resume or cfg.run.overwrite):
        raise ConfigError(
            f"run directory {path} already exists; set run.overwrite or run.resume to use it"
        )


def prepare_config(
    config: ConfigLike = None,
    *,
    reward_funcs: Sequence[RewardLike] = (),
    reward_weights: Sequence[float] | None = None,
    dataset: Any = None,
    eval_dataset: Any = None,
) -> Config:
    """The run config with the given objects in it (dataset files written)."""
    cfg = _config(config)
    data = cfg.model_dump(mode="json", exclude_none=True)
    if reward_funcs:
        components, local = _components(reward_funcs, reward_weights)
        if local and cfg.orchestrator.backend != "local":
            raise ConfigError(
                f"reward function {local[0]} cannot be imported by another process (a lambda, "
                f"closure or __main__ function); orchestrator.backend = "
                f"{cfg.orchestrator.backend!r} needs one defined at module level in a module"
            )
        data["reward"]["components"] = components
    elif reward_weights is not None:
        raise ConfigError("reward_weights given without reward_funcs")
    if eval_dataset is not None and dataset is None:
        raise ConfigError("eval_dataset given without dataset")
    if dataset is not None:
        _check_run_dir_free(cfg)
        folder = (Path(cfg.run.output_dir) / f"{cfg.run.name}.data").absolute()
        write_rows(dataset, folder / "train.jsonl", "dataset")
        data["data"].update(type="file", path=str(folder / "train.jsonl"))
        data["data"].pop("eval_path", None)
        if eval_dataset is not None:
            write_rows(eval_dataset, folder / "eval.jsonl", "eval_dataset")
            data["data"]["eval_path"] = str(folder / "eval.jsonl")
    return config_from_dict(data)


async def atrain(
    config: ConfigLike = None,
    *,
    reward_funcs: Sequence[RewardLike] = (),
    reward_weights: Sequence[float] | None = None,
    dataset: Any = None,
    eval_dataset: Any = None,
) -> TrainResult:
    """`train` for code already inside an event loop (a notebook): `await temper.atrain(...)`."""
    from temper.orchestrator.loop import Orchestrator

    cfg = prepare_config(
        config,
        reward_funcs=reward_funcs,
        reward_weights=reward_weights,
        dataset=dataset,
        eval_dataset=eval_dataset,
    )
    orch = Orchestrator(cfg)
    try:
        final = await orch.run()
    finally:
        await orch.close()
    guard = orch.guard
    return TrainResult(
        Path(cfg.run.output_dir) / cfg.run.name, final, guard.stop_reason, guard.interrupted_at
    )


def train(
    config: ConfigLike = None,
    *,
    reward_funcs: Sequence[RewardLike] = (),
    reward_weights: Sequence[float] | None = None,
    dataset: Any = None,
    eval_dataset: Any = None,
) -> TrainResult:
    """Run RL training, as `temper train` does, and return where it wrote its files.

    `config`: a `temper.config.Config`, a dict of sections (`{"trainer": {"lr": 1e-5}}`),
    a TOML path, or None for the built-in default run. `reward_funcs`: functions with
    TRL's signature `(prompts, completions, **columns) -> list[float]`, or component
    dicts such as `{"type": "format", "weight": 0.1}`; when given they replace the
    config's reward components. `reward_weights`: one weight per entry (default 1.0).
    `dataset` / `eval_dataset`: a list of dicts or a `datasets.Dataset`, read with the
    config's `data.prompt_field`, `data.answer_field` and so on (without
    `eval_dataset`, `data.eval_size` rows are held out). Bad input raises
    `temper.errors.ConfigError` (or `DataError`) with one line naming it.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise ConfigError("temper.train() was called inside an event loop; await temper.atrain()")
    return asyncio.run(
        atrain(
            config,
            reward_funcs=reward_funcs,
            reward_weights=reward_weights,
            dataset=dataset,
            eval_dataset=eval_dataset,
        )
    )
