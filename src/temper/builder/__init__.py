"""temper.builder: the one place a run's components are built from config.

Each module builds from its own config section, with one builder per ``type`` where
a section has variants: `engines` (``[engine]``), `rewards` (``[reward]``), `tasks`
(``[data]``, ``[env]``, ``[sampler]``, ``[sft]``), `rollouts` (single-turn or env
episodes), `trainer` (``[trainer]``, ``[algo]``, ``[critic]``), `backends`
(``orchestrator.backend``), `sinks` (``log.sinks``) and `suites` (``temper eval
--suite``). `model.RunModel` is what they all derive from the model (tokenizer,
image processor, image store): made once per process and passed down.

Training, eval, serving and rollout workers all build here; the layers below
never import the builder (rollout workers get `rollouts.build_worker_parts` handed
to them). `tests/test_architecture.py` checks that no other module constructs
these components.
"""
