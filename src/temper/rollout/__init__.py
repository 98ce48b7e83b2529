"""temper.rollout: drive an engine (and an env) into trajectories, token in, token out.

`sources.py` (the `RolloutSource` protocol: `SingleTurnRollouts`,
`EpisodeRollouts`), `single_turn.py` (prompt rendering, a group per task),
`multi_turn.py` (episodes: each turn appends exactly the sampled ids, then the
observation rendered incrementally; limits, env errors), `scoring.py` (rewards
onto trajectories). The `Trajectory` record itself is `temper.records`.
"""
