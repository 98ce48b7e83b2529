"""temper.backends: where a run's rollouts are made, and how its engines get weights.

The orchestrator holds one `RolloutBackend` (`base.py`: the protocol, `Rollouts`,
`publish_weights`, `free_during_train`) and never an engine:

- `local.py`: `LocalBackend`, the run's one engine in this process;
- `remote.py`: `RemoteBackend` over a pool of rollout workers, and its
  `PoolRolloutSource` (each task's group is one request; a dead worker costs only
  its own groups, retried elsewhere); weights through a shared-memory ring;
- `worker.py`: `RolloutWorker`, the engine and rollout source a worker builds with
  the function the builder hands it (`temper.builder.rollouts.build_worker_parts`);
- `routing.py`: the request table, routing and retry rules both pools share;
- `process.py` + `pool.py`: workers as local processes (a Pipe each, heartbeats,
  restarts); `ray_actor.py` + `ray_pool.py` + `ray_backend.py`: workers as Ray
  actors in a placement group, weights through Ray's object store.

See docs/workers.md and docs/scaling.md.
"""
