"""One training step in a parallel layout against the same step in one process.

Trains the built-in tiny model on one fixed batch of scored trajectories (two
mini-batches, so the old policy's logprobs run too) with `PolicyTrainer` and
with `DistributedTrainer` in the layout given, then prints one JSON line: the
largest weight difference after the step, the metrics that differ by more than
1e-5 relative, and whether every trajectory got its trainer logprobs. The
layouts that the tests do not run (8 ranks are too many for a 2-core CI) are
checked with this:

    .venv/bin/python scripts/parallel_parity.py --world-size 8 --tp 2 --pp 2 \\
        --sequence-parallel
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from temper.config.schema import AlgoConfig
from temper.models import load_model
from temper.trainer.distributed import DistributedTrainer
from temper.trainer.policy_trainer import PolicyTrainer

# The batch and optimizer settings the distributed tests train with (scored groups of 3,
# responses of 1 to 9 tokens, two mini-batches, a small learning rate: tests/fp32.py).
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from tests.trainer.test_distributed import CFG  # noqa: E402
from tests.trainer.test_distributed import _batch as batch  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--pp-schedule", default="1f1b", choices=["1f1b", "gpipe"])
    parser.add_argument("--sequence-parallel", action="store_true")
    parser.add_argument("--loss-parallel", action="store_true")
    parser.add_argument("--unpacked", action="store_true", help="train unpacked (not with pp)")
    args = parser.parse_args()
    base = CFG.model_copy(update={"packing": not args.unpacked})
    plain = PolicyTrainer(load_model("tiny"), base, AlgoConfig(), 4, pad_id=0)
    want = plain.train_step(batch(1))
    layout = base.model_copy(
        update={
            "world_size": args.world_size,
            "tp": args.tp,
            "pp": args.pp,
            "pp_schedule": args.pp_schedule,
            "sequence_parallel": args.sequence_parallel,
            "loss_parallel": args.loss_parallel,
        }
    )
    start = time.monotonic()
    trainer = DistributedTrainer(load_model("tiny"), "tiny", layout, AlgoConfig(), 4, 0)
    try:
        trajs = batch(1)
        got = trainer.train_step(trajs)
        a, b = plain.model.state_dict(), trainer.model.state_dict()
        max_diff = max(float((a[k] - b[k]).abs().max()) for k in a)
    finally:
        trainer.close()
    off = {
        k: [want[k], got.get(k)]
        for k in want
        if got.get(k) is None or abs(want[k] - got[k]) > 1e-5 * max(1.0, abs(want[k]))
    }
    print(
        json.dumps(
            {
                "layout": vars(args),
                "max_weight_diff": max_diff,
                "metrics_off": off,
                "trainer_logprobs_set": all(t.trainer_logprobs is not None for t in trajs),
                "parity": max_diff < 1e-5 and not off,
                "seconds": round(time.monotonic() - start, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
