"""A GRPO run of a vision-language model end to end: a parquet dataset with image
bytes, rollouts through the HF engine, the trainer's forward over the stored ids
and images, and a checkpoint that loads back as a VLM with its processor."""

from __future__ import annotations

import json

import pytest

from temper.cli.main import main
from temper.vision import load_image
from tiny_llava import picture_dataset as _dataset
from tiny_llava import picture_png as _png


@pytest.mark.slow
def test_a_vlm_trains_from_a_parquet_dataset_with_images(llava_path, tmp_path):
    _dataset(tmp_path / "train.parquet", range(6))
    _dataset(tmp_path / "eval.parquet", range(100, 102))
    args = [
        "train",
        f"--model.path={llava_path}",
        "--engine.type=hf",
        "--data.type=file",
        f"--data.path={tmp_path / 'train.parquet'}",
        f"--data.eval_path={tmp_path / 'eval.parquet'}",
        f"--run.output_dir={tmp_path / 'runs'}",
        "--run.name=vlm",
        "--orchestrator.steps=2",
        "--orchestrator.prompts_per_step=2",
        "--orchestrator.group_size=3",
        "--orchestrator.drop_zero_variance_groups=false",
        "--orchestrator.max_response_tokens=6",
        "--eval.at_start=false",
        "--eval.every=0",
        "--log.progress=false",
        "--log.trajectories_per_step=6",
        "--checkpoint.every=2",
    ]
    assert main(args) == 0
    run = tmp_path / "runs" / "vlm"
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert all("loss" in m and m["tokens_generated"] > 0 for m in metrics)
    # The trainer re-ran each sample's forward over its stored images: the train /
    # engine logprob mismatch is float noise, not a model that never saw the image.
    assert all(m["train_infer_logprob_diff"] < 1e-4 for m in metrics)
    # Each picture stored once, under its hash, however many samples showed it.
    stored = sorted(p.stem for p in (run / "images").glob("*/*.png"))
    shown = {
        sha
        for f in (run / "trajectories").glob("*.jsonl")
        for line in f.read_text().splitlines()
        for _, sha in json.loads(line)["images"]
    }
    assert shown and shown <= set(stored)
    dataset = [*range(6), 100, 101]  # training rows and (final eval) held-out rows
    assert set(stored) <= {load_image(_png(s)).sha256 for s in dataset}
    # The checkpoint is a VLM with its processor: it loads back as one.
    from temper.vision.processor import VisionProcessor

    ckpt = run / "checkpoints" / "step_2"
    assert VisionProcessor.from_pretrained(ckpt) is not None
    from temper.models import load_model

    assert type(load_model(ckpt)).__name__ == "LlavaForConditionalGeneration"
