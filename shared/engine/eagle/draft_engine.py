"""The feature-level draft: DraftEngine's prefill / speculate over an EagleRunner, with target features.

Beyond the token-only draft, every call carries the target's features of the
tokens it brings (``PrefillItem.features``, ``SpecItem.features``)::

    prefill   prompt x_0..x_{P-1}             features f_0..f_{P-2} (or ..f_{P-1})   (row t feeds token t+1)
    speculate new tokens (accepted + bonus)   features of the tokens the target ran since the last call

A prefill whose first P prompt positions the draft's prefix cache holds needs
rows from f_{P-1} on only: its block may start there (or at 0, the rows before
are then just kept).

Every check (dtype, width, position range, an unknown sequence) runs before
anything changes, so bad features cost the caller an INVALID_ARGUMENT and
nothing else. Chain and beam drafting are the token draft's own drafters,
unchanged: the runner feeds each new node the head's output at its parent. A call
of chains of one length, or trees of one shape (greedy or sampling requests), runs
as one static draft instead (static_chain.py, static_tree.py: the head's forwards in one body, one
host read; a CUDA graph on a GPU).
"""

from __future__ import annotations

from shared.engine import cuda_graphs, prefix_blocks
from shared.engine.draft_engine import DraftEngine
from shared.engine.eagle import static_inputs
from shared.engine.eagle.static_chain import EagleChainStep, EagleSampledChain
from shared.engine.eagle.static_tree import EagleTreeStep
from shared.engine.eagle.runner import EagleRunner
from shared.engine.errors import InvalidRequestError
from shared.engine.types import PrefillItem, SpecItem


class FeatureDraftEngine(DraftEngine):
    runner: EagleRunner

    def __init__(self, runner: EagleRunner, **limits):
        super().__init__(runner, **limits)
        if runner.config.static_step and static_inputs.supported(runner):  # greedy chains and trees
            graphs = cuda_graphs.pool_for(runner)
            self.chains = EagleChainStep(runner, graphs)
            self.sampled_chains = EagleSampledChain(runner, graphs)
            self.trees = EagleTreeStep(runner, graphs)

    @property
    def spec(self):
        return self.runner.spec

    def _check_prefill(self, item: PrefillItem) -> None:
        block = item.features
        need = len(item.prompt_ids) - 1  # the first token has no predecessor
        if block is None:
            if need:
                raise InvalidRequestError(
                    f"sequence {item.seq_id!r}: a feature draft needs the target's features of the prompt "
                    f"({need} rows, positions 0..{need - 1})"
                )
            return
        first = max(0, self._served(item) - 1) if block.start else 0  # rows before f_{P-1} feed cached positions
        if block.start > first or block.end < need:
            raise InvalidRequestError(
                f"sequence {item.seq_id!r}: prompt of {len(item.prompt_ids)} tokens needs feature rows "
                f"{first}..{need - 1}, got rows {block.start}..{block.end - 1}"
            )
        if block.end > len(item.prompt_ids):
            raise InvalidRequestError(
                f"sequence {item.seq_id!r}: {block.num_rows} feature rows for a prompt of {len(item.prompt_ids)} tokens"
            )
        if block.dtype != self.spec.dtype or block.width != self.runner.feature_width:
            raise InvalidRequestError(
                f"sequence {item.seq_id!r}: features of width {block.width} in {block.dtype}; this head reads "
                f"width {self.runner.feature_width} in {self.spec.dtype}"
            )

    def _served(self, item: PrefillItem) -> int:
        """Prompt positions the draft's prefix cache holds for this item now."""
        salt = item.cache_salt if self.runner.config.prefix_caching else None
        return prefix_blocks.cached_tokens(self.runner.cache, item.prompt_ids, salt)

    def _prefilled(self, seq, item: PrefillItem) -> None:
        if item.features is not None:
            if item.features.start:
                self.runner.start_features_at(seq, item.features.start)
            self.runner.add_features(seq, item.features, ahead=True)

    def _check_item(self, item: SpecItem) -> None:
        if item.features is None:
            return
        seq = self.runner.get(item.seq_id)
        committed = seq.num_committed - item.rollback + len(item.new_tokens)
        self.runner.check_features(seq, item.features, num_committed=committed, rollback=item.rollback)

    def _apply(self, seq, item: SpecItem) -> None:
        super()._apply(seq, item)
        if item.features is not None:
            self.runner.add_features(seq, item.features)
