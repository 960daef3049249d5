"""load_causal_lm: every tiny family from an HF directory, dtype/device resolution, errors,
and the real SmolLM2 from its prepared HF directory and straight from the .gguf."""

import pytest
import torch

from shared.engine.errors import EngineError, ModelLoadError
from shared.engine.loading import load_causal_lm, resolve_device, resolve_dtype
from shared.models import smollm2
from shared.models.tiny import build_tiny, save_tiny

IDS = torch.tensor([[0, 5, 17, 200, 3, 42]])


def test_loads_each_tiny_family_from_hf_dir(tmp_path, tiny_family):
    kwargs = dict(seed=3, max_position_embeddings=256)
    directory = save_tiny(tmp_path / tiny_family, tiny_family, **kwargs)
    loaded = load_causal_lm(directory)

    assert type(loaded.model).__name__.lower().startswith(tiny_family)
    assert loaded.name == tiny_family
    assert loaded.tokenizer is None  # tiny dirs carry no tokenizer
    assert (loaded.vocab_size, loaded.max_context) == (512, 256)
    assert loaded.dtype == torch.float32 and loaded.device == torch.device("cpu")
    assert not loaded.model.training
    assert not any(p.requires_grad for p in loaded.model.parameters())
    # The loaded weights are the saved ones: same logits as the in-memory build.
    with torch.no_grad():
        assert torch.equal(loaded.model(IDS).logits, build_tiny(tiny_family, **kwargs)(IDS).logits)


def test_explicit_dtype_and_device(tiny_model_dir):
    loaded = load_causal_lm(tiny_model_dir, dtype="bf16", device="cpu")
    assert loaded.dtype == torch.bfloat16
    assert next(loaded.model.parameters()).dtype == torch.bfloat16
    assert next(loaded.model.parameters()).device == torch.device("cpu")


def test_dtype_and_device_resolution():
    cuda = torch.cuda.is_available()
    assert resolve_device("auto") == torch.device("cuda" if cuda else "cpu")
    assert resolve_dtype("auto", "cpu") == torch.float32
    assert resolve_dtype("float16") == torch.float16
    assert resolve_dtype(torch.bfloat16) == torch.bfloat16
    assert resolve_dtype("auto") == (torch.bfloat16 if cuda else torch.float32)
    with pytest.raises(ModelLoadError, match="unknown dtype"):
        resolve_dtype("float8")
    with pytest.raises(ModelLoadError, match="unknown device"):
        resolve_device("tpu:0")
    if not cuda:
        with pytest.raises(ModelLoadError, match="CUDA is not available"):
            resolve_device("cuda")


def test_missing_path_is_a_clear_error(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist") as info:
        load_causal_lm(tmp_path / "nope")
    assert isinstance(info.value, EngineError)
    assert info.value.grpc_code == "FAILED_PRECONDITION"


def test_not_a_model_is_a_clear_error(tmp_path):
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_causal_lm(tmp_path)
    (tmp_path / "weights.bin").write_bytes(b"\0" * 16)
    with pytest.raises(ModelLoadError, match="not a .gguf"):
        load_causal_lm(tmp_path / "weights.bin")
    (tmp_path / "broken.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(ModelLoadError, match="broken.gguf"):
        load_causal_lm(tmp_path / "broken.gguf")
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(ModelLoadError, match="cannot load a causal LM"):
        load_causal_lm(tmp_path)


# --- the real demo target (prepared by `make models`; skipped when it is not) ---------------


@pytest.fixture(scope="module")
def smollm2_hf(smollm2_dir):
    return load_causal_lm(smollm2_dir)


@pytest.fixture(scope="module")
def smollm2_from_gguf(smollm2_gguf):
    return load_causal_lm(smollm2_gguf)  # dequantizes: ~20-40 s on 2 cores


def test_smollm2_hf_dir(smollm2_hf):
    config = smollm2_hf.model.config
    assert config.model_type == "llama"
    assert config.num_key_value_heads < config.num_attention_heads  # GQA, 9 / 3
    assert (smollm2_hf.vocab_size, smollm2_hf.max_context) == (49152, 8192)
    assert smollm2_hf.dtype == torch.float32
    assert not hasattr(smollm2_hf.model, "hf_quantizer")
    assert smollm2_hf.tokenizer is not None


def test_smollm2_chat_template(smollm2_hf):
    tokenizer = smollm2_hf.tokenizer
    ids = smollm2.check_chat_template(tokenizer)
    text = tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system") and text.endswith("<|im_start|>assistant\n")
    assert tokenizer.eos_token == "<|im_end|>"


def test_smollm2_answers_the_probe(smollm2_hf):
    ids = smollm2.check_chat_template(smollm2_hf.tokenizer)
    with torch.no_grad():
        out = smollm2_hf.model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)
    assert "Paris" in smollm2_hf.tokenizer.decode(out[0, len(ids) :])


def test_smollm2_gguf_agrees_with_hf_dir(smollm2_hf, smollm2_from_gguf):
    assert smollm2_from_gguf.name == "SmolLM2-135M-Instruct.Q4_1"
    # Both tokenizers render the chat template to the same ids ...
    ids = smollm2.check_chat_template(smollm2_hf.tokenizer)
    assert smollm2.check_chat_template(smollm2_from_gguf.tokenizer) == ids
    # ... and both models pick the same greedy next token with (near) equal logits.
    with torch.no_grad():
        a = smollm2_hf.model(torch.tensor([ids])).logits[0, -1]  # [vocab_size]
        b = smollm2_from_gguf.model(torch.tensor([ids])).logits[0, -1]
    assert int(a.argmax()) == int(b.argmax())
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
