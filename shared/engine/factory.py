"""Model source → ready engine, in one call (what services, the launcher and tests share).

    engine, loaded = build_target_engine("~/.cache/tandem/models/smollm2-135m-instruct")
    engine.prefill([...])                 # loaded.tokenizer / vocab_size / max_context describe the model

The runner is named after role and model ("target:smollm2-135m-instruct"), so
an OutOfBlocksError says which service ran out. The model-free drafts
(``build_ngram_draft_engine``, prompt lookup; ``build_suffix_draft_engine``,
suffix trees) load nothing and hold no KV cache.
"""

from __future__ import annotations

from pathlib import Path

import torch

from shared.engine.config import EngineConfig
from shared.engine.draft_engine import DraftEngine
from shared.engine.eagle.draft_engine import FeatureDraftEngine
from shared.engine.eagle.runner import EagleRunner
from shared.engine.grammar import GrammarBook
from shared.engine.loading import LoadedModel, load_causal_lm
from shared.engine.ngram_drafter import NgramDraftEngine
from shared.engine.runner import ModelRunner
from shared.engine.suffix_drafter import SuffixConfig, SuffixDraftEngine
from shared.engine.target_engine import TargetEngine
from shared.engine.tokenizer_dir import has_tokenizer


def build_target_engine(
    source: Path | str,
    *,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "auto",
    engine_config: EngineConfig | None = None,
    with_tokenizer: bool = True,
) -> tuple[TargetEngine, LoadedModel]:
    """Load a local HF directory or .gguf and wrap it in a TargetEngine; raises ModelLoadError."""
    loaded, runner = _load("target", source, device, dtype, engine_config, with_tokenizer)
    engine = TargetEngine(runner)
    engine.grammars = grammar_book(loaded.source, runner.vocab_size)
    return engine, loaded


def build_draft_engine(
    source: Path | str,
    *,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "auto",
    engine_config: EngineConfig | None = None,
    with_tokenizer: bool = True,
) -> tuple[DraftEngine, LoadedModel]:
    """Load a local HF directory or .gguf and wrap it in a DraftEngine; raises ModelLoadError."""
    loaded, runner = _load("draft", source, device, dtype, engine_config, with_tokenizer)
    engine = DraftEngine(runner)
    engine.grammars = grammar_book(loaded.source, runner.vocab_size)
    return engine, loaded


def build_feature_draft_engine(
    head_dir: Path | str,
    *,
    target_dir: Path | str | None = None,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "auto",
    engine_config: EngineConfig | None = None,
    feature_dtype: str = "float16",
) -> FeatureDraftEngine:
    """An EAGLE-3 head (its directory; the embedding from ``target_dir`` when the head has none); raises ModelLoadError."""
    from shared.engine.eagle.loading import load_head
    from shared.engine.loading import resolve_device, resolve_dtype

    dev = resolve_device(device)
    head = load_head(head_dir, target_dir=target_dir, dtype=resolve_dtype(dtype, dev), device=dev)
    runner = EagleRunner(head, engine_config, name=f"draft:{Path(head_dir).name}", feature_dtype=feature_dtype)
    engine = FeatureDraftEngine(runner)
    tokenizer_dir = Path(head_dir) if has_tokenizer(Path(head_dir)) or target_dir is None else Path(target_dir)
    engine.grammars = grammar_book(tokenizer_dir, runner.vocab_size)
    return engine


def build_ngram_draft_engine(
    min_ngram: int = 1, max_ngram: int = 4, *, vocab_size: int | None = None
) -> NgramDraftEngine:
    """Prompt lookup behind DraftEngine's interface; ``vocab_size`` (the target's) enables token-id checks."""
    return NgramDraftEngine(vocab_size, min_ngram=min_ngram, max_ngram=max_ngram)


def build_suffix_draft_engine(
    config: SuffixConfig | None = None, *, vocab_size: int | None = None
) -> SuffixDraftEngine:
    """Suffix-tree drafting (SuffixDecoding) behind DraftEngine's interface; ``vocab_size`` enables token-id checks."""
    return SuffixDraftEngine(vocab_size, config)


def _load(
    role: str,
    source: Path | str,
    device: str | torch.device,
    dtype: str | torch.dtype,
    engine_config: EngineConfig | None,
    with_tokenizer: bool,
) -> tuple[LoadedModel, ModelRunner]:
    loaded = load_causal_lm(source, dtype=dtype, device=device, with_tokenizer=with_tokenizer)
    return loaded, ModelRunner(loaded.model, engine_config, name=f"{role}:{loaded.name}")


def grammar_book(source: Path | None, vocab_size: int) -> GrammarBook | None:
    """Structured output for a model directory with a tokenizer, when llguidance is installed
    (``pip install -e '.[grammar]'``); the tokenizer loads on the first request that carries a grammar."""
    if source is None or not has_tokenizer(Path(source)):
        return None
    try:
        import llguidance  # noqa: F401
    except ImportError:
        return None
    return GrammarBook(Path(source), vocab_size)
