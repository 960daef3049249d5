"""ModelRunner: one batched forward over mixed work, on a transformers model with a paged KV cache.

A forward takes, per sequence, a ``Work``: feed the committed tokens not yet
in the KV cache (a prefill or the last bonus token) and/or new speculative
tree nodes, and return the logits rows asked for. Prefill, plain decode,
tree verification and draft steps are all this one call::

    work             fed tokens                       logits rows returned
    prefill          prompt                           root (last prompt token)
    decode/verify    bonus token + tree nodes         root + every node
    draft step       new beam nodes                   every new node

``commit(seq, tokens)`` appends tokens to the committed sequence, keeping the
KV entries of the tree path that spelled them (moved down into place) and
dropping every other speculative entry; ``commit(seq, [])`` is a rollback.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import torch

from shared.engine import cpu_linear, fused
from shared.engine.attention.base import ATTN_IMPLEMENTATION, BatchLayout, SeqLayout, register, select_backend
from shared.engine.config import EngineConfig
from shared.engine.early_exit import EarlyExitController
from shared.engine.early_exit_forward import Candidate, forward_early_exit, tree_candidates
from shared.engine.tuned_lens import TunedLens
from shared.engine.feature_capture import FeatureCapture
from shared.engine.errors import (
    ContextLengthError,
    DuplicateSequenceError,
    InvalidRequestError,
    InvalidTreeError,
    OutOfBlocksError,
    UnknownSequenceError,
)
from shared.engine import prefix_blocks, prefix_features
from shared.engine.kv_cache import PagedKVCache
from shared.engine.sequence import Sequence
from shared.engine.types import ForwardCost, SamplingParams


@dataclass
class Work:
    seq: Sequence
    new_nodes: list[tuple[int, int]] = field(default_factory=list)  # (token id, parent index in seq.tree)
    want_root: bool = False  # logits at the last committed token
    want_nodes: bool = False  # logits at each new node
    max_fed: int | None = None  # feed at most this many committed tokens (a prefill chunk); None = all
    want_fed: bool = False  # with want_root: logits at every fed token before the last (prompt log-probabilities)


@dataclass
class ForwardOutput:
    logits: torch.Tensor  # [num_rows, vocab_size] float32
    root_rows: list[int | None]  # per work: row of its root logits
    node_rows: list[int | None]  # per work: first row of its new nodes' logits (consecutive)
    cost: ForwardCost
    # per work asking want_fed: first row of its fed tokens' logits (num_fed - 1 rows, then its root row)
    fed_rows: list[int | None] = field(default_factory=list)
    # per work: new-node indices early exit stopped before the last layer (their logits rows are not valid)
    pruned: list[list[int]] = field(default_factory=list)
    # per work: (node, layer, pruned) for each node a check put outside its top-K: pruned there, or flagged and
    # kept by a shadow check (early_exit.layer_outcomes)
    flags: list[list[tuple[int, int, bool]]] = field(default_factory=list)
    # per work: (packed row of the first fed committed token, how many were fed, position of the first)
    fed: list[tuple[int, int, int]] = field(default_factory=list)
    node_packed: list[int] = field(default_factory=list)  # per work: packed row of its first new node
    features: torch.Tensor | None = None  # [T, width] hidden states at the asked layers (feature_layers)
    # per work: the stored feature rows [num_served, width] of the positions the prefix cache served in this
    # forward (they come right before its fed rows); None when it served none or no features were asked
    feature_prefix: list[torch.Tensor | None] = field(default_factory=list)
    # the token id of each logits column when the model scores a reduced vocabulary (an EAGLE-3 head's draft
    # vocabulary); None: column j is token j
    vocab_ids: torch.Tensor | None = None

    def root(self, i: int) -> torch.Tensor:
        return self.logits[self.root_rows[i]]

    def nodes(self, i: int, count: int) -> torch.Tensor:
        start = self.node_rows[i]
        return self.logits[start : start + count]


class ModelRunner:
    """Owns a model, its KV pool and the sequences that live in it."""

    def __init__(self, model, config: EngineConfig | None = None, *, name: str = "model"):
        self.config = config or EngineConfig()
        self.name = name
        register()
        model.set_attn_implementation(ATTN_IMPLEMENTATION)
        self.model = model
        cfg = model.config
        self.max_context = self.config.max_context or cfg.max_position_embeddings
        running = self._running_model(model)  # the model, or the fused decoder and its LM head (fused/)
        # the modules holding every weight a forward reads (what an offload moves)
        self.weight_modules = (model,) if running is model else (model, running)
        self.packed_linears = (
            cpu_linear.prepack(running, self.config.cpu_prepack_min_rows) if self.config.cpu_prepack else 0
        )
        cpu_linear.pad_single_rows(running)  # CPU, 16 bits: a decode's products as a verify's (row exactness)
        self.decoder = running.get_decoder()
        self.lm_head = running.get_output_embeddings()
        self.exit_lens: TunedLens | None = None  # early exit's tuned lens (TargetEngine.set_early_exit)
        self.vocab_size = model.get_input_embeddings().weight.shape[0]
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        num_blocks = self.config.num_blocks or max(
            1,
            self.config.kv_cache_bytes
            // PagedKVCache.bytes_per_block(
                cfg.num_hidden_layers, self.config.block_size, cfg.num_key_value_heads, head_dim, self.dtype
            ),
        )
        self.cache = PagedKVCache(
            num_layers=cfg.num_hidden_layers,
            num_blocks=num_blocks,
            block_size=self.config.block_size,
            num_kv_heads=cfg.num_key_value_heads,
            head_dim=head_dim,
            dtype=self.dtype,
            device=self.device,
        )
        self.base_blocks = num_blocks  # the pool's start-up size; it may grow by kv_grow_blocks (resize_kv)
        self.max_blocks = num_blocks + self.config.kv_grow_blocks
        self.backend = select_backend(self.config.attention_backend, self.cache, self.device)
        self.seqs: dict[str, Sequence] = {}
        self.reserved: set[int] = set()  # KV blocks no sequence owns: the CUDA graphs' scratch (cuda_graphs.py)
        self._capture: FeatureCapture | None = None  # hooks for feature-level drafts, made on first use

    def _running_model(self, model):
        """The fused decoder over ``model`` when the config asks for it and the architecture has one, else ``model``."""
        decoder = fused.build(model, self.max_context) if self.config.fused_layers else None
        return model if decoder is None else fused.FusedCausalLM(decoder, model.get_output_embeddings())

    @property
    def capture(self) -> FeatureCapture:
        if self._capture is None:
            self._capture = FeatureCapture(self.decoder)
        return self._capture

    # ------------------------------------------------------------------ sequences

    def add(
        self, seq_id: str, token_ids: list[int], sampling: SamplingParams | None = None, cache_salt: str | None = ""
    ) -> Sequence:
        """``cache_salt``: prefix-cache tenant (None: this sequence never shares blocks)."""
        if seq_id in self.seqs:
            raise DuplicateSequenceError(f"sequence {seq_id!r} is already live")
        if not token_ids:
            raise InvalidRequestError(f"sequence {seq_id!r}: empty prompt")
        self.check_tokens(token_ids, what=f"sequence {seq_id!r}")
        if len(token_ids) > self.max_context:
            raise ContextLengthError(
                f"sequence {seq_id!r}: prompt of {len(token_ids)} tokens exceeds the context window of {self.max_context}"
            )
        salt = cache_salt if self.config.prefix_caching else None
        seq = Sequence(seq_id=seq_id, token_ids=list(token_ids), sampling=sampling or SamplingParams(), cache_salt=salt)
        self.seqs[seq_id] = seq
        return seq

    def get(self, seq_id: str) -> Sequence:
        seq = self.seqs.get(seq_id)
        if seq is None:
            raise UnknownSequenceError(f"unknown sequence {seq_id!r}")
        return seq

    def release(self, seq_id: str) -> None:
        seq = self.seqs.pop(seq_id, None)
        if seq is None:
            raise UnknownSequenceError(f"unknown sequence {seq_id!r}")
        self.cache.allocator.free(seq.block_ids)
        seq.block_ids = []

    def check_tokens(self, token_ids: list[int], *, what: str) -> None:
        for t in token_ids:
            if not (0 <= t < self.vocab_size):
                raise InvalidRequestError(f"{what}: token id {t} is outside the vocabulary [0, {self.vocab_size})")

    def check_accounting(self) -> None:
        """Every block is free, cached, or held by exactly as many live block tables as its reference count
        says (architecture.md §4); a shared block is a cached one, full and below every holder's KV end."""
        allocator = self.cache.allocator
        allocator.check()
        holders: dict[int, int] = {b: 1 for b in self.reserved}
        for s in self.seqs.values():
            assert len(s.block_ids) == len(set(s.block_ids)), f"{s.seq_id} lists a block twice"
            assert len(s.block_ids) >= self.cache.blocks_for(s.num_cached + len(s.tree))
            for i, b in enumerate(s.block_ids):
                holders[b] = holders.get(b, 0) + 1
                if b in allocator.prefix:  # cached KV is never written: the block lies below the KV end
                    assert (i + 1) * self.cache.block_size <= s.num_cached or allocator.ref(b) == 1
        assert holders == {b: allocator.ref(b) for b in allocator.owners()}, "reference counts and block tables disagree"

    # ------------------------------------------------------------------ forward

    def _validate(self, works: list[Work]) -> int:
        """Check every work item before anything is mutated; returns the blocks the batch needs."""
        needed = 0
        seen: set[str] = set()
        for w in works:
            seq = w.seq
            if seq.seq_id in seen:
                raise InvalidRequestError(f"sequence {seq.seq_id!r} appears twice in one batch")
            seen.add(seq.seq_id)
            if self.seqs.get(seq.seq_id) is not seq:
                raise UnknownSequenceError(f"unknown sequence {seq.seq_id!r}")
            base = len(seq.tree)
            for i, (token, parent) in enumerate(w.new_nodes):
                if not (-1 <= parent < base + i):
                    raise InvalidTreeError(
                        f"sequence {seq.seq_id!r}: node {base + i} has parent {parent}; parents must precede "
                        f"their children (-1 <= parent < node index)"
                    )
                if not (0 <= token < self.vocab_size):
                    raise InvalidRequestError(
                        f"sequence {seq.seq_id!r}: tree token id {token} is outside the vocabulary [0, {self.vocab_size})"
                    )
            if w.new_nodes and seq.num_cached < seq.num_committed and len(seq.tree):
                raise InvalidRequestError(f"sequence {seq.seq_id!r}: tree extended before committed tokens were run")
            total = seq.num_logical + len(w.new_nodes)
            if total > self.max_context:
                raise ContextLengthError(
                    f"sequence {seq.seq_id!r}: {seq.num_committed} tokens + {total - seq.num_committed} speculative "
                    f"exceed the context window of {self.max_context}"
                )
            if w.max_fed is not None:
                if w.new_nodes or len(seq.tree) or w.max_fed < 1:
                    raise InvalidRequestError(f"sequence {seq.seq_id!r}: a prefill chunk takes no tree and >= 1 token")
                total = min(total, seq.num_cached + w.max_fed)
            first_write = seq.num_committed - 1 if w.want_root and seq.num_cached == seq.num_committed else seq.num_cached
            needed += max(0, self.cache.blocks_for(total) - len(seq.block_ids))
            needed += prefix_blocks.cow_blocks(self.cache, seq, first_write, max(total, first_write + 1))
        if needed > self.cache.num_free_blocks:
            raise OutOfBlocksError(
                f"{self.name}: batch needs {needed} more KV blocks, {self.cache.num_free_blocks} of "
                f"{self.cache.num_blocks} are free"
            )
        return needed

    def _slots(self, seq: Sequence, logical: torch.Tensor) -> torch.Tensor:
        bs = self.cache.block_size
        table = torch.tensor(seq.block_ids, dtype=torch.long)
        return table[logical // bs] * bs + logical % bs

    @torch.inference_mode()
    def forward(
        self,
        works: list[Work],
        early_exit: EarlyExitController | None = None,
        feature_layers: tuple[int, ...] | None = None,
    ) -> ForwardOutput:
        """One batched forward; ``early_exit`` lets tree nodes of fresh trees stop at intermediate layers;
        ``feature_layers`` also returns the hidden states at those layers (features for an EAGLE draft)."""
        if not works:
            raise InvalidRequestError("empty batch")
        if feature_layers:
            self.capture.check(tuple(feature_layers))
        self._validate(works)
        start = time.perf_counter()

        input_ids: list[torch.Tensor] = []
        positions: list[torch.Tensor] = []
        new_slots: list[torch.Tensor] = []
        seq_layouts: list[SeqLayout] = []
        out_rows: list[int] = []  # packed token rows whose logits we return
        root_rows: list[int | None] = []
        node_rows: list[int | None] = []
        fed_rows: list[int | None] = []
        snapshots = [(w.seq, w.seq.num_cached, len(w.seq.tree), len(w.seq.block_ids)) for w in works]
        store = self._feature_store(works, feature_layers)  # feature rows kept with the blocks, or None
        served: list[torch.Tensor | None] = []  # per work: KV slots [num_served] of the blocks attached
        candidates: list[Candidate] = []  # tree nodes early exit may prune
        fed_info: list[tuple[int, int, int]] = []
        node_packed: list[int] = []
        q_start = 0
        try:
            for w in works:
                seq = w.seq
                n = seq.num_committed
                attached_from = seq.num_cached
                if not w.want_fed:  # prompt log-probabilities need every prompt token fed
                    # cached blocks of its prefix: shared, not fed (a feature step: only blocks with their rows)
                    prefix_blocks.attach(self.cache, seq, featured=bool(feature_layers))
                attached_to = seq.num_cached
                if w.want_root and seq.num_cached == n:
                    seq.num_cached = n - 1  # re-run the last token: its logits were not kept
                end = n if w.max_fed is None else min(n, seq.num_cached + w.max_fed)  # a chunk ends before n
                prefix_blocks.writable(self.cache, seq, seq.num_cached, end)
                fed = torch.tensor(seq.token_ids[seq.num_cached : end], dtype=torch.long)  # [num_fed]
                first_new = len(seq.tree)
                for token, parent in w.new_nodes:
                    seq.tree.add(token, parent)
                total = seq.num_logical if end == n else end
                grow = self.cache.blocks_for(total) - len(seq.block_ids)
                if grow > 0:
                    seq.block_ids += self.cache.allocator.allocate(grow, seq.seq_id)

                node_ids = torch.arange(first_new, max(first_new, total - n))  # [num_new] (none in a chunk)
                node_tokens = torch.tensor([seq.tree.token_ids[j] for j in node_ids.tolist()], dtype=torch.long)
                node_depths = torch.tensor([seq.tree.depths[j] for j in node_ids.tolist()], dtype=torch.long)
                fed_pos = torch.arange(seq.num_cached, end)  # [num_fed]
                q_len = len(fed_pos) + len(node_ids)
                fed_info.append((q_start, len(fed_pos), seq.num_cached))
                node_packed.append(q_start + len(fed_pos))
                self._work_inputs(seq, fed_pos, node_ids)

                input_ids += [fed, node_tokens]
                positions += [fed_pos, n + node_depths]
                logical_new = torch.cat([fed_pos, n + node_ids])
                kv_slots = self._slots(seq, torch.arange(total))  # [kv_len]
                new_slots.append(kv_slots[logical_new])
                served.append(kv_slots[attached_from:attached_to] if feature_layers and attached_to > attached_from else None)

                cols = torch.arange(total)
                mask = torch.zeros(q_len, total, dtype=torch.bool)  # [q_len, kv_len]
                mask[: len(fed_pos)] = cols[None, :] <= fed_pos[:, None]
                if len(node_ids):
                    mask[len(fed_pos) :, :n] = True
                    mask[len(fed_pos) :, n:] = seq.tree.anc[node_ids][:, : total - n]
                seq_layouts.append(SeqLayout(q_start, q_len, kv_slots, mask, causal=len(seq.tree) == 0))

                root_rows.append(None)
                node_rows.append(None)
                want_root = w.want_root and end == n  # a chunk that stops short of the prompt's end has no root
                fed_rows.append(len(out_rows) if w.want_fed and want_root else None)
                if fed_rows[-1] is not None:
                    out_rows += range(q_start, q_start + len(fed_pos) - 1)
                if want_root:
                    root_rows[-1] = len(out_rows)
                    out_rows.append(q_start + len(fed_pos) - 1)
                if w.want_nodes and len(node_ids):
                    node_rows[-1] = len(out_rows)
                    out_rows += range(q_start + len(fed_pos), q_start + q_len)
                    if early_exit is not None and first_new == 0 and len(fed_pos):
                        candidates += tree_candidates(len(root_rows) - 1, seq, q_start + len(fed_pos), node_tokens)
                q_start += q_len

            layout = BatchLayout(
                seqs=seq_layouts,
                new_slots=torch.cat(new_slots).to(self.device),
                num_tokens=q_start,
                device=self.device,
            )
            self.backend.plan(layout)
            ids = torch.cat(input_ids).to(self.device)[None]  # [1, T]
            pos = torch.cat(positions).to(self.device)[None]  # [1, T]
            pruned: list[list[int]] = [[] for _ in works]
            flags: list[list[tuple[int, int, bool]]] = [[] for _ in works]
            features = None
            with self._recording(feature_layers, q_start):
                if candidates:
                    hidden = forward_early_exit(self, ids, pos, layout, candidates, early_exit, pruned, flags)
                    for w, nodes in zip(works, pruned):
                        w.seq.tree.pruned.update(nodes)
                else:
                    hidden = self._decode(ids, pos, layout)  # [T, hidden]
                if feature_layers:
                    features = self.capture.features()  # [T, width]
            rows = torch.tensor(out_rows, dtype=torch.long, device=self.device)
            logits = self._logits(works, hidden, rows)  # [num_rows, vocab]
            if store is not None:
                store.write(layout.new_slots, features)  # every fed and node row, beside its KV
            feature_prefix = [None if s is None else store.read(s.to(self.device)) for s in served]  # [served, width]
        except BaseException:
            for seq, num_cached, tree_len, num_blocks in snapshots:
                if num_blocks * self.cache.block_size == num_cached:  # blocks it may have attached: let go
                    prefix_blocks.detach(self.cache, seq, num_blocks, num_cached)
                seq.num_cached = num_cached
                del seq.tree.token_ids[tree_len:], seq.tree.parent_ids[tree_len:], seq.tree.depths[tree_len:]
                seq.tree.pruned = {j for j in seq.tree.pruned if j < tree_len}
            raise
        for (seq, attached_from, first_node, _), (_, num_fed, first_fed) in zip(snapshots, fed_info):
            seq.num_cached = first_fed + num_fed  # n, or a chunk's end
            prefix_features.after_forward(seq, attached_from, first_fed, first_node, store is not None)
            self._ran(seq, attached_from, first_fed)
            prefix_blocks.register(self.cache, seq, self._registrable(seq))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        cost = ForwardCost(
            duration_s=time.perf_counter() - start,
            num_seqs=len(works),
            num_batched_tokens=q_start,
            num_context_tokens=layout.num_context_tokens,
        )
        return ForwardOutput(
            logits=logits,
            root_rows=root_rows,
            node_rows=node_rows,
            fed_rows=fed_rows,
            cost=cost,
            pruned=pruned,
            flags=flags,
            fed=fed_info,
            node_packed=node_packed,
            features=features,
            feature_prefix=feature_prefix,
            vocab_ids=self.logit_ids,
        )

    def _feature_store(self, works: list[Work], feature_layers: tuple[int, ...] | None):
        """The store a feature step keeps its rows in, when one of its sequences may share blocks; else None."""
        if not feature_layers or all(w.seq.cache_salt is None for w in works):
            return None
        width = len(feature_layers) * self.decoder.embed_tokens.embedding_dim
        store, fresh = self.cache.feature_store(tuple(feature_layers), width)
        if fresh:  # another layer set, the first, or none (no room): no sequence has rows stored
            for seq in self.seqs.values():
                prefix_features.reset(seq)
        return store

    # ------------------------------------------------------------------ what a subclass may change (eagle/runner.py)

    def _work_inputs(self, seq: Sequence, fed_pos: torch.Tensor, node_ids: torch.Tensor) -> None:
        """Called per work while the batch is packed, in row order: inputs beyond token ids go here."""

    def _ran(self, seq: Sequence, attached_from: int, first_fed: int) -> None:
        """After a forward that succeeded: the prefix cache served positions ``attached_from .. first_fed-1``
        (when first_fed is past it) and the forward fed ``first_fed .. num_cached-1``."""

    def _registrable(self, seq: Sequence) -> int | None:
        """The KV positions below which the sequence's full blocks may enter the prefix index (None: all)."""
        return None

    def _decode(self, ids: torch.Tensor, pos: torch.Tensor, layout: BatchLayout) -> torch.Tensor:
        """ids, pos [1, T] → final hidden states [T, hidden]."""
        hidden = self.decoder(input_ids=ids, position_ids=pos, use_cache=False, tandem_backend=self.backend)
        return hidden.last_hidden_state[0]

    # the token ids of the logits' columns (ForwardOutput.vocab_ids); None: the whole vocabulary in order
    logit_ids: torch.Tensor | None = None

    def _logits(self, works: list[Work], hidden: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden[rows]).float()  # [num_rows, vocab]

    def _recording(self, feature_layers: tuple[int, ...] | None, num_tokens: int):
        if not feature_layers:
            return contextlib.nullcontext()
        return self.capture.recording(tuple(feature_layers), num_tokens)

    # ------------------------------------------------------------------ commit

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Drop the last ``num_tokens`` committed tokens (and the tree): undo an optimistic commit (FASER §4.3)."""
        if not (0 <= num_tokens < seq.num_committed):
            raise InvalidRequestError(
                f"sequence {seq.seq_id!r}: cannot roll back {num_tokens} of {seq.num_committed} committed tokens"
            )
        if num_tokens == 0:
            return
        seq.tree.clear()
        del seq.token_ids[-num_tokens:]
        seq.num_cached = min(seq.num_cached, seq.num_committed)
        prefix_features.after_truncate(seq)
        prefix_blocks.trim_keys(self.cache, seq)
        keep = self.cache.blocks_for(seq.num_cached)
        if keep < len(seq.block_ids):
            self.cache.allocator.free(seq.block_ids[keep:])
            del seq.block_ids[keep:]

    def commit(self, seq: Sequence, tokens: list[int]) -> int:
        """Append tokens; reuse the KV of the tree path that spells their prefix. Returns nodes reused."""
        self.check_tokens(tokens, what=f"sequence {seq.seq_id!r}")
        n = seq.num_committed
        path: list[int] = []
        node = -1
        if seq.num_cached == n:  # tree entries are only valid on top of a fully cached prefix
            for token in tokens:
                child = seq.tree.child(node, token)
                if child is None:
                    break
                path.append(child)
                node = child
        if path and path != list(range(len(path))):
            src = self._slots(seq, n + torch.tensor(path)).to(self.device)  # [len(path)]
            dst = self._slots(seq, n + torch.arange(len(path))).to(self.device)  # [len(path)]
            self.cache.move(src, dst)
            if self.cache.features is not None and seq.tree_feature_rows:
                self.cache.features.move(src, dst)  # the path's feature rows go with its KV
        seq.tree.clear()
        seq.token_ids += tokens
        seq.num_cached = n + len(path) if seq.num_cached == n else seq.num_cached  # un-run tokens stay un-run
        prefix_features.after_commit(seq, n, path)
        keep = self.cache.blocks_for(seq.num_cached)
        if keep < len(seq.block_ids):
            self.cache.allocator.free(seq.block_ids[keep:])
            del seq.block_ids[keep:]
        prefix_blocks.register(self.cache, seq, self._registrable(seq))
        return len(path)
