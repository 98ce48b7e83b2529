"""Dotted config overrides on the command line: ``--trainer.lr=3e-4`` or ``--run.name demo2``."""

from __future__ import annotations

from temper.errors import ConfigError


def split_overrides(extra: list[str]) -> list[str]:
    """Turn `--a.b=1 --c.d 2` into ["a.b=1", "c.d=2"]."""
    out: list[str] = []
    i = 0
    while i < len(extra):
        arg = extra[i]
        if not arg.startswith("--") or "." not in arg.split("=")[0]:
            raise ConfigError(
                f"unrecognised argument {arg!r} (overrides look like --section.key=value)"
            )
        if "=" in arg:
            out.append(arg[2:])
            i += 1
        elif i + 1 < len(extra):
            out.append(f"{arg[2:]}={extra[i + 1]}")
            i += 2
        else:
            raise ConfigError(f"override {arg} has no value")
    return out


def join_override_values(argv: list[str]) -> list[str]:
    """Turn `--a.b 1` into `--a.b=1` before argparse sees it.

    Otherwise argparse takes the value of an override written with a space for
    the optional CONFIG argument (`temper eval --eval.size 8` read "8" as a file).
    """
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        is_override = arg.startswith("--") and "=" not in arg and "." in arg[2:]
        if is_override and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out.append(f"{arg}={argv[i + 1]}")
            i += 2
        else:
            out.append(arg)
            i += 1
    return out
