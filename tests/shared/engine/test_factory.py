"""Engines built from a model directory in one call."""

from __future__ import annotations

import pytest

from shared.engine.config import EngineConfig
from shared.engine.draft_engine import DraftEngine
from shared.engine.errors import ModelLoadError
from shared.engine.factory import build_draft_engine, build_target_engine
from shared.engine.target_engine import TargetEngine
from shared.engine.types import PrefillItem, SpecItem, TokenTree, VerifyItem


def test_builds_working_engines_with_the_given_kv_config(tiny_model_dir):
    config = EngineConfig(num_blocks=32, block_size=8)
    target, loaded = build_target_engine(tiny_model_dir, device="cpu", engine_config=config, with_tokenizer=False)
    draft, _ = build_draft_engine(tiny_model_dir, device="cpu", engine_config=config)
    assert isinstance(target, TargetEngine) and isinstance(draft, DraftEngine)
    assert target.runner.name == "target:tiny-llama" and draft.runner.name == "draft:tiny-llama"
    assert target.runner.cache.num_blocks == 32 and target.runner.cache.block_size == 8
    assert (loaded.vocab_size, loaded.max_context, loaded.tokenizer) == (512, 1024, None)

    first = target.prefill([PrefillItem("s", [5, 6, 7])])[0].first_token
    draft.prefill([PrefillItem("s", [5, 6, 7])])
    (tree,) = draft.speculate([SpecItem("s", [first], chain_len=3)])
    (result,) = target.verify([VerifyItem("s", tree)])
    # same weights on both sides: greedy accepts every drafted token
    assert result.num_accepted == 3 and len(result.tokens) == 4
    assert target.verify([VerifyItem("s", TokenTree())])[0].num_accepted == 0


def test_missing_source_is_a_model_load_error(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        build_target_engine(tmp_path / "nope")
