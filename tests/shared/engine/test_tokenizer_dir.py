"""The scheduler's tokenizer loading: the same tokenizer AutoTokenizer gives, without importing torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from shared.engine.tokenizer_dir import has_tokenizer, load_tokenizer

TEXTS = ["hello world", "  Spaces, tabs\tand\nnewlines", "Ünïcödé ✓ 日本語", "<|im_start|>user\nhi<|im_end|>", ""]


def test_generic_fast_tokenizer_equals_auto_tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    auto = AutoTokenizer.from_pretrained(smollm2_dir, local_files_only=True)
    ours = load_tokenizer(smollm2_dir)
    assert type(ours) is type(auto)
    assert ours.eos_token_id == auto.eos_token_id and ours.all_special_ids == auto.all_special_ids
    for text in TEXTS:
        ids = auto(text)["input_ids"]
        assert ours(text)["input_ids"] == ids, text
        assert ours.decode(ids, skip_special_tokens=True) == auto.decode(ids, skip_special_tokens=True)
    chat = [{"role": "user", "content": "Name a colour."}]
    assert ours.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == auto.apply_chat_template(
        chat, tokenize=False, add_generation_prompt=True)


def test_the_scheduler_loads_its_tokenizer_without_torch(smollm2_dir):
    code = ("import sys; import services.scheduler.main; from services.scheduler.text import TextCodec; "
            f"c = TextCodec.load({str(smollm2_dir)!r}); print(c is not None, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[3])
    assert out.stdout.split() == ["True", "False"], out.stderr[-2000:]


def test_other_tokenizer_classes_and_bare_directories(tmp_path):
    assert not has_tokenizer(tmp_path) and not has_tokenizer(tmp_path / "missing")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "SomethingElse"}))
    assert has_tokenizer(tmp_path)
    from shared.engine import tokenizer_dir

    assert tokenizer_dir._tokenizer_class(tmp_path) == "SomethingElse"  # not the generic one: AutoTokenizer's path
    (tmp_path / "tokenizer_config.json").write_text("not json")
    assert tokenizer_dir._tokenizer_class(tmp_path) is None
