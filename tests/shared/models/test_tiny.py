import time

import pytest
import torch

from shared.models.tiny import FAMILIES, build_tiny, save_tiny

IDS = torch.tensor([[1, 2, 3, 4, 5]])


def test_builds_fast(tiny_family):
    build_tiny(tiny_family)  # first build of a family pays for class imports
    start = time.perf_counter()
    build_tiny(tiny_family)
    assert time.perf_counter() - start < 1.0


def test_gqa_config_and_shape(tiny_model, tiny_family):
    config = tiny_model.config
    assert config.model_type == tiny_family
    assert config.num_key_value_heads < config.num_attention_heads  # grouped-query attention
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (4, 2, 16)
    assert (config.vocab_size, config.num_hidden_layers, config.max_position_embeddings) == (512, 2, 1024)
    assert getattr(config, "sliding_window", None) is None
    assert next(tiny_model.parameters()).dtype == torch.float32
    assert not tiny_model.training and not any(p.requires_grad for p in tiny_model.parameters())
    with torch.no_grad():
        assert tiny_model(IDS).logits.shape == (1, 5, 512)  # [batch, tokens, vocab_size]


def test_same_seed_same_model_other_seed_other_model():
    a, b, c = build_tiny(seed=7), build_tiny(seed=7), build_tiny(seed=8)
    for name, tensor in a.state_dict().items():
        assert torch.equal(tensor, b.state_dict()[name]), name
    with torch.no_grad():
        assert not torch.equal(a(IDS).logits, c(IDS).logits)


def test_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny(seed=0)
    assert torch.equal(torch.rand(3), expected)


def test_overrides_and_bad_shapes():
    model = build_tiny("qwen2", vocab_size=100, hidden_size=32, num_layers=1, num_heads=8, num_kv_heads=1)
    assert (model.config.vocab_size, model.config.head_dim, model.config.num_key_value_heads) == (100, 4, 1)
    assert build_tiny(initializer_range=0.5).config.initializer_range == 0.5
    with pytest.raises(ValueError, match="num_kv_heads"):
        build_tiny(num_heads=4, num_kv_heads=3)
    with pytest.raises(ValueError, match="unknown family"):
        build_tiny("gpt2")


def test_save_tiny_writes_an_hf_dir(tmp_path):
    directory = save_tiny(tmp_path / "m", "mistral", num_layers=1)
    assert (directory / "config.json").is_file()
    assert (directory / "model.safetensors").is_file()
    assert set(FAMILIES) == {"llama", "qwen2", "qwen3", "mistral"}
