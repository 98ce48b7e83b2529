"""OpenEnv's own server for benchmarks/env_service.py: the env that ``openenv init``
generates (its echo template, in ``--template``), served by openenv-core's
``create_app`` under uvicorn, with ``max_concurrent_envs`` raised to ``--max``.

``--kind sleep`` and ``--kind cpu`` subclass the template's env the way an OpenEnv
author would: an async 1 s step (``step_async``, which OpenEnv's WebSocket handler
awaits), or a step that runs the same snippet in Temper's warm bubblewrap sandbox.
"""

from __future__ import annotations

import argparse
import asyncio
import sys


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--template", required=True, help="the folder `openenv init` wrote into")
    p.add_argument("--kind", choices=["echo", "sleep", "cpu"], default="echo")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--max", type=int, default=8192)
    args = p.parse_args()
    sys.path.insert(0, args.template)
    import uvicorn
    from echo_env.models import EchoAction, EchoObservation
    from echo_env.server.echo_env_environment import EchoEnvironment
    from openenv.core.env_server import create_app

    env_class = EchoEnvironment
    if args.kind == "sleep":

        class SleepEnvironment(EchoEnvironment):
            async def step_async(self, action, timeout_s=None, **kwargs):
                await asyncio.sleep(1.0)
                return self.step(action)

        env_class = SleepEnvironment
    elif args.kind == "cpu":
        from env_service_envs import SNIPPET

        from temper.sandbox import SandboxPool

        pool = SandboxPool(pool_size=4, allow_fallback=False)

        class CPUEnvironment(EchoEnvironment):
            def step(self, action, timeout_s=None, **kwargs):
                out = pool.run_python(SNIPPET).stdout.strip()
                return super().step(EchoAction(message=out))

        env_class = CPUEnvironment
    app = create_app(
        env_class, EchoAction, EchoObservation, env_name="echo_env", max_concurrent_envs=args.max
    )
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", backlog=8192)


if __name__ == "__main__":
    main()
