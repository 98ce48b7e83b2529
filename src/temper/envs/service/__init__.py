"""Envs as services: any env `env.type` names, served over Temper's wire (`temper.wire`).

- `messages`: the protocol's version, records on the wire, images by hash, the env
  fingerprint a run and a server must share.
- `server`: `EnvService`, one env's sessions with their limits and reaper
  (`temper env-serve`).
- `client`: `EnvFleet` and `RemoteEnv`, what a run with ``env.servers`` plays on.

The protocol, fleets and capacity model: docs/env_service.md.
"""
