import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from temper.trainer.checkpoint import list_checkpoints, load_checkpoint_state, save_checkpoint


class _Tok:
    def save_pretrained(self, path):
        (path / "tokenizer_config.json").write_text("{}")


def _model():
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    return LlamaForCausalLM(cfg)


def test_save_prunes_and_round_trips(tmp_path):
    model = _model()
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, model, _Tok(), {"x": step}, {"version": step}, keep=2)
    ckpts = list_checkpoints(tmp_path)
    assert [p.name for p in ckpts] == ["step_2", "step_3"]
    state, trainer_state, rng = load_checkpoint_state(ckpts[-1])
    assert state == {"step": 3, "version": 3}
    assert trainer_state == {"x": 3}
    assert torch.equal(rng["torch"], torch.get_rng_state())
    again = LlamaForCausalLM.from_pretrained(ckpts[-1])
    for (k, a), b in zip(model.state_dict().items(), again.state_dict().values(), strict=True):
        assert torch.equal(a, b), k


def test_failed_save_leaves_no_partial_checkpoint(tmp_path):
    class Boom(_Tok):
        def save_pretrained(self, path):
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        save_checkpoint(tmp_path, 5, _model(), Boom(), {}, {}, keep=2)
    assert list_checkpoints(tmp_path) == []
    assert not any(p.name.startswith("step_5") for p in tmp_path.iterdir())
    # A directory without state.json (a crash mid-rename) is not listed as complete.
    (tmp_path / "step_9").mkdir()
    assert list_checkpoints(tmp_path) == []
