"""temper.data: where tasks come from, and which are drawn.

`arithmetic.py` (procedural tasks, levels 1-4, a disjoint held-out split),
`visual.py` (procedural pictures: count, number, redder, same_colour;
docs/vision.md), `datasets.py` (JSONL, parquet and HF datasets with field
mapping), `conversations.py` (SFT conversations rendered into trajectories whose
loss mask marks the assistant turns), `sampler.py` (the `TaskSampler` protocol;
`ListSampler`, `ProceduralSampler`), `task_stats.py` + `task_sampling.py`
(`AdaptiveSampler`: targeted, curriculum and weighted sampling from each step's
results; docs/sampling.md), `preferences.py` (synthetic preference pairs for the
tiny reward model), `preference_rows.py` (DPO's chosen/rejected pairs: loaded,
checked, rendered into trajectories). The `Task` record itself is `temper.records`.
"""
