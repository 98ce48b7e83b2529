"""`temper env-serve`, `temper sandbox-serve` and `env.servers`: bad input is one line, exit 2."""

from __future__ import annotations

from pathlib import Path

from ports import dead_url
from temper.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("temper: error: ")
    return err


def test_servers_that_never_answer_stop_the_run_before_it_starts(tmp_path, capsys):
    args = ["train", str(ROOT / "configs" / "tool_use.toml"), f"--run.output_dir={tmp_path}"]
    assert main([*args, f'--env.servers=["{dead_url("ws", "/v1")}"]']) == 2
    assert "no server answered" in _one_line_error(capsys)
    assert main([*args, '--env.servers=["http://127.0.0.1:1/v1"]']) == 2
    assert "not a ws:// or wss:// URL" in _one_line_error(capsys)
    assert not (tmp_path / "tool_use" / "metrics.jsonl").exists()


def test_servers_refuse_bad_flags_and_configs_in_one_line(capsys):
    assert main(["env-serve"]) == 2
    assert "set env.type" in _one_line_error(capsys)
    assert main(["env-serve", "--workers", "0", "--env.type=tool_use"]) == 2
    assert "--workers" in _one_line_error(capsys)
    assert main(["env-serve", "--env.type=tool_use", '--env.servers=["ws://x:1/v1"]']) == 2
    assert "leave env.servers empty" in _one_line_error(capsys)
    assert main(["sandbox-serve", "--pool-size", "0"]) == 2
    assert "--pool-size" in _one_line_error(capsys)
