"""Single-turn rollouts: one prompt, a group of sampled completions.

The prompt is rendered once through the tokenizer's chat template; the engine
gets those ids and returns sampled ids, which become the trajectory unchanged.
Multi-turn episodes (envs) build on the same `Trajectory`.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from temper.engine.base import Engine, SamplingParams
from temper.errors import DataError, PromptTooLongError
from temper.records import Task, Trajectory
from temper.vision.images import Image, ImageError
from temper.vision.prompting import PromptImages


class PromptRenderer:
    """Turns a Task into prompt token ids via the chat template.

    With ``vision`` (a vision-language model's `VisionProcessor`), prompts may
    hold images: each placeholder the template writes is expanded into the
    image's token run, and `render_images` returns the images in order (and
    puts them in ``store``, the run's `ImageStore`, when given). A task with
    images for a text-only model is refused with a `DataError`.
    """

    def __init__(
        self,
        tokenizer: Any,
        system_prompt: str | None = None,
        vision: Any | None = None,
        store: Any | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.vision = vision
        #: How images are normalised, spliced and kept (the store: the run's, if any).
        self.images = PromptImages(vision, store)

    def render(self, task: Task) -> tuple[list[int], str]:
        """Ids and text of the task's prompt (images are not stored: a look only)."""
        ids, text, _ = self.render_images(task, keep=False)
        return ids, text

    def render_images(
        self, task: Task, keep: bool = True
    ) -> tuple[list[int], str, list[tuple[int, Image]]]:
        """Ids, text and images of the task's prompt: ``(offset, image)`` pairs, the
        offset where the image's token run starts (empty for text). ``keep`` puts
        the images in the store (a prompt that will be trained on)."""
        messages = task.messages()
        if self.system_prompt and not any(m.get("role") == "system" for m in messages):
            messages = [{"role": "system", "content": self.system_prompt}, *messages]
        try:
            messages = self.images.normalize(messages)
        except ImageError as exc:
            raise DataError(f"task {task.id}: {exc}") from None
        text = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        placed: list[tuple[int, Image]] = []
        ids = self.images.splice(ids, messages, 0, placed, keep)
        return ids, text, placed


def check_prompt_fits(task: Task, prompt_ids: list[int], max_context: int) -> None:
    """Raise PromptTooLongError when the prompt leaves no room to generate.

    A prompt that fits but leaves fewer than max_new_tokens positions is allowed:
    its samples stop at the context limit with finish_reason "length".
    """
    if len(prompt_ids) >= max_context:
        raise PromptTooLongError(
            f"task {task.id}: prompt is {len(prompt_ids)} tokens, longer than the model "
            f"context ({max_context} tokens)"
        )


async def rollout_group(
    engine: Engine,
    tokenizer: Any,
    task: Task,
    prompt_ids: list[int],
    prompt_text: str,
    params: SamplingParams,
    group_id: int,
    images: list[tuple[int, Image]] | None = None,
) -> list[Trajectory]:
    result = await PromptImages().generate(engine, prompt_ids, params, images or [])
    trajs = []
    for sample in result.samples:
        n = len(sample.token_ids)
        versions = sample.policy_versions or [engine.version] * n
        trajs.append(
            Trajectory(
                task_id=task.id,
                group_id=group_id,
                prompt_ids=list(prompt_ids),
                response_ids=list(sample.token_ids),
                loss_mask=[1] * n,
                behaviour_logprobs=list(sample.logprobs),
                versions=list(versions),
                finish_reason=sample.finish_reason,
                prompt_text=prompt_text,
                response_text=tokenizer.decode(sample.token_ids, skip_special_tokens=True),
                category=task.category,
                answer=task.answer,
                images=[[offset, im.sha256] for offset, im in images or []],
            )
        )
    return trajs


async def rollout_groups(
    engine: Engine,
    renderer: PromptRenderer,
    tasks: list[Task],
    params: SamplingParams,
    seed: int | None = None,
) -> list[list[Trajectory]]:
    """Generate one group per task, all submitted together to the engine.

    When `seed` is set, task i samples with seed `seed * 100003 + i`, so results
    do not depend on scheduling.
    """
    coros = []
    for i, task in enumerate(tasks):
        ids, text, images = renderer.render_images(task)
        check_prompt_fits(task, ids, engine.max_context)
        p = params if seed is None else replace(params, seed=seed * 100003 + i)
        coros.append(rollout_group(engine, renderer.tokenizer, task, ids, text, p, i, images))
    return list(await asyncio.gather(*coros))
