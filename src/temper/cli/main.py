"""The `temper` command: train, eval, generate, export, report, replay, inspect, compare,
dash, serve, serve-rm.

Config overrides are dotted flags (`--trainer.lr=3e-4`, `--run.name demo2`).
A user error (TemperError) prints one line `temper: error: ...` and exits 2
with no traceback. Nothing heavy is imported before a command's config or flags
are checked, so such an error comes at once; torch and transformers load after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

from temper.cli import env_serve, export
from temper.cli.overrides import join_override_values, split_overrides
from temper.cli.train import cmd_train
from temper.errors import ConfigError, TemperError

#: Set to "1" by ``--verbose``: transformers' progress bars and warnings stay on
#: (`temper.builder.model.VERBOSE_ENV`; a test keeps the two equal).
VERBOSE_ENV = "TEMPER_VERBOSE"


def _add_verbose_flag(p: argparse.ArgumentParser) -> None:
    """``--verbose`` on the commands that load a model."""
    p.add_argument(
        "--verbose",
        action="store_true",
        help=f"show transformers' progress bars and warnings (also: {VERBOSE_ENV}=1)",
    )


def _add_limit_flags(p: argparse.ArgumentParser) -> None:
    """The request limits both servers share (`temper.serve.limits`)."""
    from temper.serve.limits import (
        DEFAULT_BODY_TIMEOUT_S,
        DEFAULT_HEADER_TIMEOUT_S,
        DEFAULT_MAX_BODY_MB,
    )

    p.add_argument(
        "--max-body-mb",
        type=float,
        default=DEFAULT_MAX_BODY_MB,
        help="larger request bodies get HTTP 413 (MiB)",
    )
    p.add_argument(
        "--header-timeout-s",
        type=float,
        default=DEFAULT_HEADER_TIMEOUT_S,
        help="close a connection whose request head takes longer (seconds)",
    )
    p.add_argument(
        "--body-timeout-s",
        type=float,
        default=DEFAULT_BODY_TIMEOUT_S,
        help="HTTP 408 for a body not received within this (seconds)",
    )


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Epilogs keep their line breaks; every flag with a real default shows it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        shown = default not in (None, False, argparse.SUPPRESS) and action.option_strings
        if shown and "%(default)" not in text:
            text += " (default: %(default)s)"
        return text


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose epilog may be built only when help is shown.

    `temper train --help` lists every config key; building that list imports the
    schema, which the other commands' start-up need not pay for.
    """

    def __init__(self, *args: Any, epilog_fn: Any = None, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)
        self.epilog_fn = epilog_fn

    def format_help(self) -> str:
        if self.epilog_fn is not None:
            self.epilog = self.epilog_fn()
        return super().format_help()


def override_keys() -> dict[str, list[str]]:
    """Each config section and its keys, as dotted overrides name them (a section chosen
    by ``type``, such as ``engine``: the keys of every type, ``type`` first)."""
    from temper.config.doc import section_models
    from temper.config.schema import Config

    out: dict[str, list[str]] = {}
    for name, field in Config.model_fields.items():
        keys = [k for model in section_models(field.annotation) for k in model.model_fields]
        out[name] = sorted(dict.fromkeys(keys), key=lambda k: k != "type")
    return out


def _overrides_epilog(command: str) -> str:
    lines = [
        "config overrides:",
        "  Any config key is a flag: --SECTION.KEY=VALUE or --SECTION.KEY VALUE.",
        '  The value is a TOML literal (3e-4, true, "text", [1, 2]) or else plain',
        "  text; overrides apply after CONFIG. Every key, its type and default:",
        "  docs/config.md; the resolved config: temper config show [CONFIG] [overrides].",
        "",
        "examples:",
        f"  temper {command} configs/arithmetic_grpo.toml --trainer.lr=3e-4",
        f"  temper {command} --run.name demo2 --orchestrator.steps 50",
        f"  temper {command} cfg.toml '--log.sinks=[\"tensorboard\"]' --model.path=./ckpt",
        "",
        "keys by section:",
    ]
    for section, keys in override_keys().items():
        lines += textwrap.wrap(
            ", ".join(keys),
            width=79,
            initial_indent=f"  {section}.",
            subsequent_indent=" " * (len(section) + 3),
        )
    return "\n".join(lines)


def _add_config_parser(sub: Any) -> None:
    c = sub.add_parser("config", help="show the resolved config")
    csub = c.add_subparsers(
        dest="config_command", required=True, parser_class=_Parser, help="what to do"
    )
    show = csub.add_parser(
        "show",
        help="print the resolved config (CONFIG and overrides over the defaults) as TOML",
        description="Print the resolved config as TOML: the defaults, then CONFIG, then\n"
        "the overrides; relative paths are shown resolved. Unset keys are left out.",
        epilog_fn=lambda: _overrides_epilog("config show"),
    )
    show.add_argument("config", nargs="?", help="TOML config file")


def cmd_config(args: argparse.Namespace, overrides: list[str]) -> int:
    from temper.config import dump_config, load_config

    print(dump_config(load_config(args.config, overrides)), end="")
    return 0


def _version() -> str:
    from temper import __version__

    return f"temper {__version__}"


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="temper", description="RL post-training for LMs.")
    p.add_argument("--version", action="version", version=_version())
    p.set_defaults(verbose=False)  # the commands that load a model add --verbose
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_run_parsers(sub)
    _add_run_dir_parsers(sub)
    _add_server_parsers(sub)
    _add_config_parser(sub)
    return p


def _add_run_parsers(sub: Any) -> None:
    """train, eval, generate."""
    t = sub.add_parser(
        "train",
        help="run RL training (no CONFIG: the built-in default run)",
        description="Run RL training. With no CONFIG: the built-in default run\n"
        "(the tiny model learning arithmetic with GRPO).",
        epilog_fn=lambda: _overrides_epilog("train"),
    )
    t.add_argument("config", nargs="?", help="TOML config file")
    t.add_argument(
        "--profile",
        action="store_true",
        help="write a Chrome trace of one step to <run>/profile/ (log.profile_step, else step 1)",
    )
    _add_verbose_flag(t)
    e = sub.add_parser(
        "eval",
        help="evaluate a model or checkpoint on held-out tasks",
        epilog_fn=lambda: _overrides_epilog("eval"),
    )
    e.add_argument("config", nargs="?", help="TOML config file")
    e.add_argument(
        "--checkpoint",
        help="model or checkpoint directory (overrides model.path); with no CONFIG, a "
        "runs/X/checkpoints/step_N is evaluated on run X's config.toml (its data, env, reward)",
    )
    e.add_argument("--out", help="write the JSON result here")
    e.add_argument(
        "--suite",
        default="builtin",
        help="builtin (held-out split of the config's task/env), gsm8k, humaneval, bfcl, "
        "miniwob (held-out MiniWoB++ instances in headless Chromium) or vision (held-out "
        "visual tasks; needs a vision-language model)",
    )
    e.add_argument("--suite-path", help="data file/folder for the gsm8k or bfcl suite")
    _add_verbose_flag(e)
    g = sub.add_parser("generate", help="sample completions for a prompt")
    g.add_argument("prompt", help="user message")
    g.add_argument("--model", default="tiny", help='model directory or "tiny"')
    g.add_argument("--n", type=int, default=1, help="completions to sample")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--max-new-tokens", type=int, default=64, help="length limit of each")
    g.add_argument("--seed", type=int, default=None, help="sampling seed (default: random)")
    _add_verbose_flag(g)
    export.add_parser(sub)


def _add_run_dir_parsers(sub: Any) -> None:
    """report, inspect, compare, plan, replay: commands on a run directory."""
    r = sub.add_parser("report", help="(re)write report.html and plots for a run directory")
    r.add_argument("run_dir", help="a run directory (holds metrics.jsonl)")
    ins = sub.add_parser(
        "inspect", help="a run's saved steps, or the best and worst samples of one step"
    )
    ins.add_argument("run_dir", help="a run directory")
    ins.add_argument(
        "--step", type=int, default=None, help="training step to show (default: list every step)"
    )
    ins.add_argument("--k", type=int, default=3, help="samples shown at each end")
    cmp = sub.add_parser("compare", help="two runs side by side: metrics and config diff")
    cmp.add_argument("run_a", help="first run directory")
    cmp.add_argument("run_b", help="second run directory")
    pl = sub.add_parser(
        "plan", help="expected step time of each placement, from a run's measured stages"
    )
    pl.add_argument("run_dir", help="a run directory")
    pl.add_argument(
        "--units", type=int, default=None, help="cores to plan for (default: the run's)"
    )
    pl.add_argument(
        "--max-staleness", type=int, default=None, help="most staleness an option may use"
    )
    pl.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    rp = sub.add_parser(
        "replay", help="re-run a run's env on recorded episodes; check observations and rewards"
    )
    rp.add_argument("trajectories", help="a trajectories/step_*.jsonl file of an env run")
    rp.add_argument("--index", type=int, default=None, help="only this line (0-based)")
    where = rp.add_mutually_exclusive_group()
    where.add_argument(
        "--servers", nargs="+", metavar="URL", help="replay on these env servers (ws://...)"
    )
    where.add_argument(
        "--in-process", action="store_true", help="replay in this process, not the run's servers"
    )


def _add_server_parsers(sub: Any) -> None:
    """serve, serve-rm, dash."""
    sv = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API")
    sv.add_argument("--model", default="tiny", help='model directory or "tiny"')
    sv.add_argument(
        "--engine",
        "--engine.type",
        dest="engine",
        default="native",
        choices=["native", "hf", "vllm"],
        help="generation engine",
    )
    sv.add_argument("--host", default="127.0.0.1", help="address to listen on")
    sv.add_argument("--port", type=int, default=8000, help="port to listen on")
    sv.add_argument(
        "--served-model-name", default=None, help="model id clients send (default: --model)"
    )
    sv.add_argument(
        "--allowed-image-dir",
        metavar="DIR",
        help="requests may name image files in DIR (default: image data URLs only)",
    )
    _add_limit_flags(sv)
    _add_verbose_flag(sv)
    rm = sub.add_parser("serve-rm", help="serve a reward model (POST /score) with dynamic batching")
    rm.add_argument(
        "model", help='directory of a one-label sequence-classification model, or "tiny-rm"'
    )
    rm.add_argument("--host", default="127.0.0.1", help="address to listen on")
    rm.add_argument("--port", type=int, default=8001, help="port to listen on")
    rm.add_argument("--max-batch-size", type=int, default=32, help="pairs scored in one forward")
    rm.add_argument("--max-wait-ms", type=float, default=5.0, help="wait this long to fill a batch")
    rm.add_argument("--max-queue", type=int, default=1024, help="queued pairs before HTTP 503")
    _add_limit_flags(rm)
    _add_verbose_flag(rm)
    env_serve.add_parser(sub)
    env_serve.add_sandbox_parser(sub)
    d = sub.add_parser("dash", help="live web dashboard over the run directories in RUNS_DIR")
    d.add_argument("runs_dir", nargs="?", default="runs", help="folder of runs")
    d.add_argument("--host", default="127.0.0.1", help="address to listen on")
    d.add_argument("--port", type=int, default=8765, help="port to listen on")


def cmd_report(args: argparse.Namespace) -> int:
    from temper.monitor.report import write_report

    path = Path(args.run_dir)
    if not (path / "metrics.jsonl").is_file():
        raise ConfigError(f"{path} is not a run directory (no metrics.jsonl)")
    print(write_report(path))
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from temper.monitor.inspect import inspect_step, list_steps

    if args.step is None:
        print(list_steps(args.run_dir))
    else:
        print(inspect_step(args.run_dir, args.step, args.k))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from temper.monitor.inspect import compare_runs

    print(compare_runs(args.run_a, args.run_b))
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from temper.orchestrator.auto_placement import run_plan
    from temper.orchestrator.stage_model import format_plan

    for flag, value in (("--units", args.units), ("--max-staleness", args.max_staleness)):
        if value is not None and value < (1 if flag == "--units" else 0):
            raise ConfigError(
                f"{flag} must be {'>= 1' if flag == '--units' else '>= 0'}, got {value}"
            )
    plan = run_plan(args.run_dir, args.units, args.max_staleness)
    print(json.dumps(plan.to_json()) if args.json else format_plan(plan))
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from temper.builder.tasks import build_env_spec, build_remote_env_spec
    from temper.config.load import load_run_config
    from temper.envs.replay import replay_episode
    from temper.monitor.sinks import read_jsonl

    path = Path(args.trajectories)
    if not path.is_file():
        raise ConfigError(f"{path} does not exist")
    config_path = path.parent.parent / "config.toml"
    if not config_path.is_file():
        raise ConfigError(f"{path} is not inside a run directory (no {config_path})")
    cfg = load_run_config(config_path)
    if not cfg.env.enabled:
        raise ConfigError(f"{config_path.parent} is a single-turn run: there is no env to replay")
    records = read_jsonl(path)
    if args.index is not None:
        if not 0 <= args.index < len(records):
            raise ConfigError(f"--index {args.index} is out of range: {path} has {len(records)}")
        records = [records[args.index]]
    if args.servers or args.in_process:
        cfg.env.servers = [] if args.in_process else list(args.servers)
    spec = build_env_spec(cfg.env.type, cfg.env.options, cfg.run.seed)
    if cfg.env.servers:
        spec = build_remote_env_spec(spec, cfg.env)
    where = f"on {', '.join(cfg.env.servers)}" if cfg.env.servers else "in process"

    async def run() -> list:
        return [await replay_episode(r, spec) for r in records]

    try:
        reports = asyncio.run(run())
    finally:
        if spec.close is not None:
            spec.close()
    bad = [r for r in reports if not r.ok]
    for r in bad:
        print(f"{r.task_id}: " + "; ".join(r.mismatches))
    turns = sum(r.turns for r in reports)
    print(f"replayed {len(reports)} episode(s), {turns} turn(s) {where}: {len(bad)} differ")
    return 1 if bad else 0


def cmd_dash(args: argparse.Namespace, overrides: list[str]) -> int:
    from temper.monitor.dashboard import serve

    if overrides:
        raise ConfigError(f"dash takes no config overrides, got {overrides[0]!r}")
    root, query = Path(args.runs_dir), ""
    if (root / "metrics.jsonl").is_file() or (root / "config.toml").is_file():
        # Given one run directory: serve its folder, with that run selected.
        root, query = root.parent, f"/?runs={root.name}"
    note = "" if root.is_dir() else " (does not exist yet: runs appear as they start)"

    def announce(url: str) -> None:
        print(f"dashboard: {url}{query}  runs: {root}{note}  (Ctrl-C stops)", flush=True)

    try:
        serve(root, args.host, args.port, announce=announce)
    except OSError as err:
        raise ConfigError(
            f"cannot listen on {args.host}:{args.port}: {err.strerror or err} (try another --port)"
        ) from err
    return 0


def _quiet_libraries(verbose: bool) -> None:
    """Keep the terminal for Temper's own progress. Nothing heavy is imported here: a
    config error comes before torch and transformers load. Whatever loads a model
    (`temper.builder.model.load_run_model`) turns transformers' progress bars and
    warnings off unless ``--verbose`` (or TEMPER_VERBOSE=1) asks for them."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if verbose:
        os.environ[VERBOSE_ENV] = "1"  # rollout worker processes inherit it


def main(argv: list[str] | None = None) -> int:
    argv = join_override_values(sys.argv[1:] if argv is None else list(argv))
    args, extra = _parser().parse_known_args(argv)
    _quiet_libraries(args.verbose)
    try:
        overrides = split_overrides(extra)
        if args.command == "train":
            return cmd_train(args, overrides)
        if args.command == "eval":
            from temper.cli.eval import cmd_eval

            return cmd_eval(args, overrides)
        if args.command == "generate":
            from temper.cli.eval import cmd_generate

            return cmd_generate(args, overrides)
        if args.command == "export":
            return export.cmd_export(args)
        if args.command == "replay":
            return cmd_replay(args)
        if args.command == "inspect":
            return cmd_inspect(args)
        if args.command == "compare":
            return cmd_compare(args)
        if args.command == "plan":
            return cmd_plan(args)
        if args.command == "serve":
            from temper.cli.serve import cmd_serve

            return cmd_serve(args, overrides)
        if args.command == "serve-rm":
            from temper.cli.serve import cmd_serve_rm

            return cmd_serve_rm(args, overrides)
        if args.command == "dash":
            return cmd_dash(args, overrides)
        if args.command == "env-serve":
            from temper.cli.env_serve import cmd_env_serve

            return cmd_env_serve(args, overrides)
        if args.command == "sandbox-serve":
            from temper.cli.env_serve import cmd_sandbox_serve

            return cmd_sandbox_serve(args, overrides)
        if args.command == "config":
            return cmd_config(args, overrides)
        return cmd_report(args)
    except TemperError as err:
        print(f"temper: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("temper: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
