"""The draft side: prefill, then speculate chains or beam-search trees for a batch in lock-step.

Every speculate call first commits the tokens the target accepted since the
last call, which keeps the KV entries of the matching draft path and drops
the rest (rollback), then runs all drafters of the batch one forward per step.
A call whose drafters are all greedy chains of one length, or all greedy trees of
one shape (beam or expansion), on a plain draft model runs them as one static
draft instead (draft_chain_step.py, draft_tree_step.py: every forward in one body,
the next tokens picked on the device, one host read; a CUDA graph on a GPU).

Elastic memory (Nightjar §5): ``offload`` drops every live sequence, moves
the weights to host memory (pinned, so ``reload`` can copy them back by DMA;
on a CPU device there is nothing to move) and frees the KV pool's tensors;
``reload`` brings the weights back and allocates a fresh, empty pool. While
offloaded, prefill and speculate raise ``WeightsOffloadedError``; the
scheduler re-prefills a sequence when it speculates for it again.
"""

from __future__ import annotations

import torch

from shared.engine import chunks, cuda_graphs, grammar_mask, spec_checks, static_draft
from shared.engine.draft_chain_step import DraftChainStep
from shared.engine.draft_tree_step import DraftTreeStep, tree_fan
from shared.engine.sampled_chain_step import SampledDraftChain
from shared.engine.drafting import BeamDrafter, ChainDrafter, ExpansionDrafter
from shared.engine.errors import ContextLengthError, InvalidRequestError, WeightsOffloadedError
from shared.engine.runner import ModelRunner, Work
from shared.engine.sampling import validate_sampling
from shared.engine.weight_moves import move_weights
from shared.engine.types import ForwardCost, PrefillItem, SpecItem, TokenTree


class DraftEngine:
    def __init__(self, runner: ModelRunner, *, max_chain: int = 32, max_depth: int = 16, max_width: int = 16):
        self.runner = runner
        self.max_chain = max_chain
        self.max_depth = max_depth
        self.max_width = max_width
        self.costs: list[ForwardCost] = []  # forwards of the last call
        self.offloaded = False
        self.grammars = None  # grammar.GrammarBook: structured output (the factory sets it when there is a tokenizer)
        # greedy chains of one length, trees of one shape, as one static body; None: every drafter runs eagerly
        self.chains: DraftChainStep | None = None
        self.sampled_chains: SampledDraftChain | None = None  # chains where a request samples
        self.trees: DraftTreeStep | None = None
        if runner.config.static_step and static_draft.runner_supported(runner):
            graphs = cuda_graphs.pool_for(runner)  # one pool (and scratch block) for every kind
            self.chains, self.trees = DraftChainStep(runner, graphs), DraftTreeStep(runner, graphs)
            self.sampled_chains = SampledDraftChain(runner, graphs)

    # ------------------------------------------------------------------ elastic memory (Nightjar §5)
    def offload(self) -> tuple[int, int]:
        """Drop every sequence, weights to host memory, KV tensors freed; (weight bytes moved, KV bytes freed)."""
        if self.offloaded:
            return 0, 0
        self.release(list(self.runner.seqs))
        if self.chains is not None and self.chains.graphs is not None:
            self.chains.graphs.release()  # its scratch block: the pool must be empty to be freed
        device = self.runner.device
        moved = move_weights(self.runner.weight_modules, torch.device("cpu"), pin=device.type == "cuda")
        freed = self.runner.cache.release_memory()
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the freed space goes back to the device, for the target to take
        self.offloaded = True
        return moved, freed

    def reload(self) -> int:
        """Weights back on the device, a fresh empty KV pool; returns the weight bytes moved."""
        if not self.offloaded:
            return 0
        device = self.runner.device
        moved = move_weights(self.runner.weight_modules, device, pin=False)
        self.runner.cache.reallocate()
        if self.chains is not None and self.chains.graphs is not None:
            self.chains.graphs.reserve()
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # the non-blocking copies are done before the next forward
        self.offloaded = False
        return moved

    def _check_resident(self) -> None:
        if self.offloaded:
            raise WeightsOffloadedError(
                "the draft's weights are offloaded to host memory (Nightjar elastic memory); call Reload first"
            )

    def prefill(self, items: list[PrefillItem]) -> None:
        self._check_resident()
        spec_checks.check_distinct_prefill(items)
        for p in items:
            if p.resume:  # the next chunk of a chunked prefill (shared/engine/chunks.py)
                chunks.check_chunk(p)
                self.runner.get(p.seq_id)
                continue
            chunks.check_chunk(p)
            spec_checks.check_prefill_item(self.runner, p)
            validate_sampling(p.sampling)
            # checked here, not only in add(): a later item failing must not strand the earlier ones
            if len(p.prompt_ids) > self.runner.max_context:
                raise ContextLengthError(
                    f"sequence {p.seq_id!r}: prompt of {len(p.prompt_ids)} tokens exceeds the context window of "
                    f"{self.runner.max_context}"
                )
            self._check_prefill(p)
        fresh = [p for p in items if not p.resume]
        grammars = grammar_mask.compile_prefills(self.grammars, fresh, required=False)
        added = [self.runner.add(p.seq_id, p.prompt_ids, p.sampling, p.cache_salt) for p in fresh]
        try:
            for seq, p in zip(added, fresh):
                seq.grammar = grammars.get(seq.seq_id)
                self._prefilled(seq, p)
            works = [Work(self.runner.get(p.seq_id), max_fed=p.max_tokens or None) for p in items]
            works = [w for w in works if w.seq.num_cached < w.seq.num_committed]  # a resumed prompt may be done
            self.costs = [self.runner.forward(works).cost] if works else []
        except BaseException:
            for seq in added:
                self.runner.release(seq.seq_id)
            raise

    def release(self, seq_ids: list[str]) -> None:
        for seq_id in seq_ids:
            self.runner.release(seq_id)

    def _validate(self, items: list[SpecItem]) -> None:
        spec_checks.check_distinct(items)
        for it in items:
            self.runner.get(it.seq_id)
            self.runner.check_tokens(it.new_tokens, what=f"sequence {it.seq_id!r}")
            if not (0 <= it.rollback < self.runner.get(it.seq_id).num_committed):
                raise InvalidRequestError(f"sequence {it.seq_id!r}: cannot roll back {it.rollback} committed tokens")
            spec_checks.check_shape(it, max_chain=self.max_chain, max_depth=self.max_depth, max_width=self.max_width)
            self._check_item(it)

    # hooks for drafts that take more than tokens (eagle/draft_engine.py); checks run before anything changes
    def _check_prefill(self, item: PrefillItem) -> None:
        pass

    def _prefilled(self, seq, item: PrefillItem) -> None:
        pass

    def _check_item(self, item: SpecItem) -> None:
        pass

    def _apply(self, seq, item: SpecItem) -> None:
        """Bring the sequence up to what the target committed: undo a failed optimistic prefix, append the tokens."""
        self.runner.truncate(seq, item.rollback)
        self.runner.commit(seq, item.new_tokens)

    def speculate(self, items: list[SpecItem]) -> list[TokenTree]:
        self._check_resident()
        self._validate(items)
        seqs = []
        for it in items:
            seq = self.runner.get(it.seq_id)
            self._apply(seq, it)
            seqs.append(seq)
        static = self._static_drafts(items, seqs)
        if static is not None:
            return static
        drafters: list[ChainDrafter | BeamDrafter | ExpansionDrafter] = []
        for it, seq in zip(items, seqs):
            if it.tree_expansion:
                drafters.append(ExpansionDrafter(seq, it.tree_expansion))
            elif it.tree_depth:
                drafters.append(BeamDrafter(seq, it.tree_depth, it.tree_width))
            else:
                drafters.append(
                    ChainDrafter(seq, it.chain_len, it.confidence_threshold, self.runner.config.draft_top_k)
                )
        self.costs = []
        while active := [d for d in drafters if not d.done]:
            works = [d.next_work() for d in active]
            out = self.runner.forward(works)
            self.costs.append(out.cost)
            for i, (d, w) in enumerate(zip(active, works)):
                logits = out.root(i)[None] if w.want_root else out.nodes(i, len(w.new_nodes))  # [rows, columns]
                rows = 1 if w.want_root else len(w.new_nodes)
                d.absorb(grammar_mask.constrain_draft(d.seq, d.tree, rows, w.want_root, logits, out.vocab_ids),
                         out.vocab_ids)  # fmt: skip
        return [grammar_mask.prune_draft(d.seq, d.tree) for d in drafters]

    def _static_drafts(self, items: list[SpecItem], seqs) -> list[TokenTree] | None:
        """The call's drafts through a static path when they all qualify (one chain length or one tree shape,
        ``StaticDraft.applies``): the items that draft nothing get empty trees; None: the eager drafters run."""
        if self.chains is None:
            return None
        drafting = [(i, it, seq) for i, (it, seq) in enumerate(zip(items, seqs))
                    if it.chain_len > 0 or it.tree_expansion or (it.tree_depth > 0 and it.tree_width > 0)]  # fmt: skip
        shapes = {(it.chain_len, it.tree_depth, it.tree_width, tuple(it.tree_expansion)) for _, it, _ in drafting}
        if len(shapes) != 1:
            return None
        first, ready = drafting[0][1], [s for _, _, s in drafting]
        if first.chain_len:
            chains = self.chains if self.chains.applies(ready) else self.sampled_chains
            if chains is None or not chains.applies(ready):
                return None
            thresholds = [it.confidence_threshold for _, it, _ in drafting]
            trees, self.costs = chains.run(ready, first.chain_len, thresholds)
        else:
            beam, fan = tree_fan(first.tree_depth, first.tree_width, tuple(first.tree_expansion))
            if self.trees is None or max(fan) > self.trees.columns or not self.trees.applies(ready):
                return None  # (more children than tokens: the eager drafters take what there is)
            trees, self.costs = self.trees.run(ready, beam, fan)
        out = [TokenTree() for _ in items]
        for (i, _, _), tree in zip(drafting, trees):
            out[i] = tree
        return out
