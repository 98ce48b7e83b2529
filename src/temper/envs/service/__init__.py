"""Envs as services: any env `env.type` names, served over Temper's wire (`temper.wire`).

- `messages`: the protocol's version, records on the wire, images by hash, the env
  fingerprint a run and a server must share.
- `server`: `EnvService`, one env's sessions with their limits and reaper
  (`temper env-serve`).
- `client`: `EnvFleet` and `RemoteEnv`, what a run with ``env.servers`` plays on.
- `openenv_compat`: the same sessions for OpenEnv's clients, at ``/ws`` (its JSON).
- `ray_fleet`: env servers as Ray actors (``env.ray_servers``, ``env-serve --ray N``).

The other way round, Temper training on an OpenEnv server, is the ``openenv`` env
(`temper.envs.openenv_client`).

The protocol, fleets and capacity model: docs/env_service.md.
"""
