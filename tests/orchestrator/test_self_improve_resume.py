"""SFT, RFT and DPO runs SIGKILLed after a checkpoint and resumed log the same metrics as
uninterrupted runs with the same seed: the SFT and DPO data positions, DPO's reference
logprobs (of the starting policy, which the resumed run no longer has), the RFT round (the
step), the task sampler and the RNG all come back from the checkpoint."""

import json

import pytest
from tests.orchestrator.kill_resume import full_then_killed_and_resumed, step_metrics

pytestmark = pytest.mark.slow

ARGS = [
    "--orchestrator.steps=3",
    "--orchestrator.prompts_per_step=4",
    "--orchestrator.group_size=4",
    "--orchestrator.max_response_tokens=24",
    "--trainer.lr=5e-4",
    "--trainer.warmup_steps=1",
    "--trainer.packing=true",
    "--eval.at_start=false",
    "--eval.every=0",
    "--eval.size=8",
    "--eval.k=1",
    "--checkpoint.every=2",
    "--log.progress=false",
    "--run.seed=3",
]
MODES = {
    # 10 conversations, 4 a step: step 3 crosses an epoch boundary of the data.
    "sft": ["--trainer.mode=sft", "--sft.size=10"],
    "rft": ["--trainer.mode=rft", "--rft.max_per_prompt=2", "--sampler.type=targeted"],
    # 10 pairs, 4 a step, packed: the same epoch boundary.
    "dpo": ["--trainer.mode=dpo", "--dpo.size=10", "--dpo.eval_size=8"],
}
#: A metric each mode's steps log, to see that they ran.
OWN_KEY = {"sft": "nll_per_token", "rft": "rft/kept_frac", "dpo": "dpo/margin"}
VOLATILE = ("time_", "train_tokens_per_s", "peak_rss")


@pytest.mark.parametrize("mode", sorted(MODES))
def test_sigkill_and_resume_matches_uninterrupted(tmp_path, mode):
    extra = MODES[mode]
    full_then_killed_and_resumed(ARGS, tmp_path, *extra)

    full = step_metrics(tmp_path / "full" / "metrics.jsonl", VOLATILE)
    again = step_metrics(tmp_path / "killed" / "metrics.jsonl", VOLATILE)
    assert sorted(again) == [1, 2, 3]
    assert OWN_KEY[mode] in full[3]
    for step in (3,):
        assert again[step].keys() == full[step].keys()
        for name, value in full[step].items():
            assert again[step][name] == pytest.approx(value, rel=1e-5, abs=1e-9), (step, name)
    final_full = json.loads((tmp_path / "full" / "eval" / "step_000003.json").read_text())
    final_again = json.loads((tmp_path / "killed" / "eval" / "step_000003.json").read_text())
    assert final_again["accuracy"] == final_full["accuracy"]
