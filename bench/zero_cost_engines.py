"""Engines that cost (almost) nothing, behind the real servicers: what is left of a step is orchestration.

    ZeroCostTarget  accepts the first-child path of every tree in full, samples a fixed bonus token, and
                    returns feature rows (zeros) of the committed tokens when asked, as the real target does
    ZeroCostDraft   drafts a chain or a tree (beam or fixed expansion) of fixed tokens, reads feature rows

Both keep only each sequence's length, answer the same errors for unknown or duplicate ids as the real
engines, and add up the time their calls take (``work_s``), which the benchmark reads over Info
(``model_name`` = "zero-cost work_ns=N calls=M"): a step's compute, subtracted from its wall time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from shared.engine.errors import DuplicateSequenceError, UnknownSequenceError
from shared.engine.kv_cache import BlockAllocator
from shared.engine.features import ITEMSIZE, FeatureBlock, FeatureSpec
from shared.engine.target_engine import TargetStepOutput
from shared.engine.types import AcceptResult, ForwardCost, PrefillResult, TokenTree

VOCAB = 32000
MAX_CONTEXT = 1 << 16
TOKEN = 7  # every drafted and sampled token


@dataclass
class _Cache:
    num_blocks: int = 1 << 14
    block_size: int = 16
    allocator: BlockAllocator = field(default_factory=lambda: BlockAllocator(0))  # what Info reads: an empty prefix cache

    @property
    def num_free_blocks(self) -> int:
        return self.num_blocks


@dataclass
class _Config:
    hidden_size: int
    num_hidden_layers: int = 32
    num_attention_heads: int = 32


class _Decoder:
    """No layers and no weights: the shape Info reports for chunk pricing (shared/engine/model_shape.py)."""

    def __init__(self) -> None:
        import torch

        self.layers = torch.nn.ModuleList()


@dataclass
class _Model:
    config: _Config


class _Device:
    type = "cpu"

    def __str__(self) -> str:
        return "cpu"


@dataclass
class _Runner:
    hidden_size: int
    seqs: dict[str, int] = field(default_factory=dict)  # seq id -> committed tokens
    vocab_size: int = VOCAB
    max_context: int = MAX_CONTEXT
    dtype: str = "float32"
    device: _Device = field(default_factory=_Device)
    cache: _Cache = field(default_factory=_Cache)
    feature_width: int = 0

    def __post_init__(self) -> None:
        self.base_blocks = self.max_blocks = self.cache.num_blocks
        self.model = _Model(_Config(self.hidden_size))
        self.decoder = _Decoder()


class _Timed:
    def __init__(self, hidden_size: int) -> None:
        self.runner = _Runner(hidden_size)
        self.work_ns = 0
        self.calls = 0
        self.costs: list[ForwardCost] = []

    def _count(self, started: int) -> None:
        self.work_ns += time.perf_counter_ns() - started
        self.calls += 1

    def release(self, seq_ids: list[str]) -> None:
        for seq_id in seq_ids:
            self.runner.seqs.pop(seq_id, None)

    def _add(self, seq_id: str, length: int) -> None:
        if seq_id in self.runner.seqs:
            raise DuplicateSequenceError(f"sequence {seq_id!r} is already live")
        self.runner.seqs[seq_id] = length

    def _length(self, seq_id: str) -> int:
        try:
            return self.runner.seqs[seq_id]
        except KeyError:
            raise UnknownSequenceError(f"unknown sequence {seq_id!r}") from None


def _rows(spec: FeatureSpec | None, hidden: int, start: int, num_rows: int) -> FeatureBlock | None:
    if spec is None:
        return None
    width = len(spec.layer_ids) * hidden
    return FeatureBlock(start, num_rows, width, spec.dtype, bytes(num_rows * width * ITEMSIZE[spec.dtype]))


def _first_child_path(tree: TokenTree) -> list[int]:
    path, parent = [], -1
    for i, p in enumerate(tree.parent_ids):
        if p == parent:
            path.append(i)
            parent = i
    return path


class ZeroCostTarget(_Timed):
    def step(self, prefills, verifies, features: FeatureSpec | None = None) -> TargetStepOutput:
        started = time.perf_counter_ns()
        for v in verifies:
            self._length(v.seq_id)
        out = TargetStepOutput()
        hidden = self.runner.hidden_size
        for p in prefills:
            self._add(p.seq_id, len(p.prompt_ids) + 1)
            out.prefills.append(PrefillResult(p.seq_id, TOKEN, _rows(features, hidden, 0, len(p.prompt_ids))))
        for v in verifies:
            n = self.runner.seqs[v.seq_id]
            path = _first_child_path(v.tree)
            status = [1 if i in path else 0 for i in range(len(v.tree))]
            tokens = [v.tree.token_ids[i] for i in path] + [TOKEN]
            self.runner.seqs[v.seq_id] = n + len(tokens)
            out.verifies.append(AcceptResult(path, tokens, status, features=_rows(features, hidden, n - 1, 1 + len(path))))
        batched = sum(len(p.prompt_ids) for p in prefills) + sum(1 + len(v.tree) for v in verifies)
        out.cost = ForwardCost(0.0, len(prefills) + len(verifies), batched, 0)
        self._count(started)
        return out

    def features(self, seq_ids: list[str], spec: FeatureSpec) -> list[FeatureBlock]:
        started = time.perf_counter_ns()
        blocks = [_rows(spec, self.runner.hidden_size, 0, self._length(s) - 1) for s in seq_ids]
        self._count(started)
        return blocks


class ZeroCostDraft(_Timed):
    def __init__(self, hidden_size: int, feature_spec: FeatureSpec | None = None) -> None:
        super().__init__(hidden_size)
        self.spec = feature_spec  # a feature-level draft: Info reports it, the scheduler sends features
        if feature_spec is not None:
            self.runner.feature_width = len(feature_spec.layer_ids) * hidden_size

    def prefill(self, items) -> None:
        started = time.perf_counter_ns()
        for item in items:
            self._add(item.seq_id, len(item.prompt_ids))
        self.costs = [ForwardCost(0.0, len(items), sum(len(i.prompt_ids) for i in items), 0)]
        self._count(started)

    def speculate(self, items) -> list[TokenTree]:
        started = time.perf_counter_ns()
        for item in items:
            self._length(item.seq_id)
        trees = []
        for item in items:
            self.runner.seqs[item.seq_id] += len(item.new_tokens) - item.rollback
            trees.append(_draft(item))
        self.costs = [ForwardCost(0.0, len(items), len(items), 0)] if any(len(t) for t in trees) else []
        self._count(started)
        return trees


def _draft(item) -> TokenTree:
    if item.chain_len:
        n = item.chain_len
        return TokenTree([TOKEN] * n, list(range(-1, n - 1)), [0.9] * n)
    expansion = list(item.tree_expansion) or [item.tree_width] * item.tree_depth
    beam = None if item.tree_expansion else item.tree_width  # a beam keeps `width` nodes per level
    parents, level = [], [-1]
    for children in expansion:
        nxt = []
        for p in level:
            for _ in range(children):
                nxt.append(len(parents))
                parents.append(p)
        level = nxt[:beam] if beam else nxt
    return TokenTree([TOKEN] * len(parents), parents, [0.5] * len(parents))
