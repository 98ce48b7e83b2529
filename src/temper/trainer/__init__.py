"""temper.trainer: the policy update.

`base.py` is the `Trainer` protocol (with `TrainerAbilities`), implemented by
`policy_trainer.py` (`PolicyTrainer`, one process; with ``trainer.mode`` sft/rft
the loss is the NLL of the loss-masked tokens; dpo trains on pairs through
`preference.py`; a distillation teacher's advantages come from `distill.py`)
and `distributed.py`
(`DistributedTrainer`: N FSDP2 ranks, `dist_worker.py`, spawned, launched by
torchrun/mpirun (`launch.py`) or as Ray actors (`ray_ranks.py`)).

Inside: `batching.py` (token-budget micro-batches; distinct prompts once),
`packing.py` (padding-free packed rows, per-segment attention), `forward.py`,
`objective.py` (the configured policy loss), `critic.py` (PPO's critic),
`step_stats.py`, `optim.py`, `checkpoint.py` (atomic checkpoints; DCP shards at
world size > 1, resumable at any world size), `parallel.py` (the `(pp, dp_shard,
tp)` mesh, tensor and sequence parallel plans), `vocab_parallel.py` (loss
parallel), `pipeline.py` (pipeline stages), `expert_parallel.py` (MoE experts
over ranks), `weight_stream.py` (rank 0 streams weights into shared memory),
`lora.py` (``[lora]``: peft's adapters in the policy; imported only with LoRA).
See docs/training.md and docs/scaling.md.
"""
