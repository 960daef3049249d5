"""Text handling: incremental detokenization with a real byte-level tokenizer, and loading rules."""

from __future__ import annotations

import random

import pytest

from services.scheduler.errors import NoTokenizerError, TandemRequestError
from services.scheduler.text import IncrementalDecoder, TextCodec

TEXT = "Héllo wörld — naïve café ☕ 日本語のテキスト and emoji 🙂🙃 with spaces  and\nnewlines."


@pytest.fixture(scope="module")
def smollm2_codec(smollm2_dir) -> TextCodec:
    codec = TextCodec.load(smollm2_dir)
    assert codec is not None
    return codec


def test_chunks_concatenate_to_the_full_decode(smollm2_codec):
    ids = smollm2_codec.encode(TEXT)
    rng = random.Random(0)
    for _ in range(20):
        decoder = smollm2_codec.stream()
        out, i = [], 0
        while i < len(ids):
            n = rng.randint(1, 4)
            out.append(decoder.push(ids[i : i + n]))
            i += n
        out.append(decoder.flush())
        assert "".join(out) == smollm2_codec.decode(ids) == TEXT
        assert not any("\ufffd" in chunk for chunk in out)  # half characters are held back


def test_smollm2_has_an_eos(smollm2_codec):
    assert smollm2_codec.eos_token_ids and all(isinstance(t, int) for t in smollm2_codec.eos_token_ids)


def test_held_back_bytes_are_flushed_at_the_end():
    # a "tokenizer" whose tokens are single UTF-8 bytes: a 3-byte character arrives in three pushes
    def decode(ids):
        return bytes(ids).decode("utf-8", errors="replace")

    data = list("a☕".encode())
    decoder = IncrementalDecoder(decode)
    assert decoder.push(data[:2]) == ""  # "a" + half a cup: held back together
    assert decoder.push(data[2:3]) == ""
    assert decoder.push(data[3:]) == "a☕"
    decoder.push([0xE2])  # a truncated character at the very end
    assert decoder.flush() == "\ufffd"


def test_directory_without_tokenizer_means_token_ids_only(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert TextCodec.load(tmp_path) is None
    assert TextCodec.load(tmp_path / "missing") is None


def test_chat_prompts_are_rendered_by_the_models_template(smollm2_codec):
    """The server side of GenerateRequest.chat and /v1/chat/completions: the template with the generation prompt."""
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    ids = smollm2_codec.encode_chat(messages)
    text = smollm2_codec.tokenizer.decode(ids)
    assert smollm2_codec.has_chat_template
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_chat_without_a_template_or_with_bad_messages_is_the_clients_to_fix(smollm2_dir):
    codec = TextCodec.load(smollm2_dir)
    with pytest.raises(TandemRequestError, match="chat template rejected"):
        codec.encode_chat([{"role": "user"}])  # no content: the template's own complaint
    codec.tokenizer.chat_template = None
    assert not codec.has_chat_template
    with pytest.raises(NoTokenizerError, match="no chat template"):  # FAILED_PRECONDITION
        codec.encode_chat([{"role": "user", "content": "Hi"}])


def test_chat_template_kwargs_reach_the_template(smollm2_dir):
    import copy

    from services.scheduler.errors import TandemRequestError

    codec = TextCodec.load(smollm2_dir)
    tokenizer = copy.deepcopy(codec.tokenizer)
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}{{ greeting | default('') }}"
    custom = TextCodec(tokenizer)
    messages = [{"role": "user", "content": "Hi"}]
    assert custom.encode_chat(messages) == custom.encode("Hi")
    assert custom.encode_chat(messages, template_kwargs={"greeting": " there"}) == custom.encode("Hi there")
    with pytest.raises(TandemRequestError, match="may not set tokenize"):
        custom.encode_chat(messages, template_kwargs={"tokenize": False})
