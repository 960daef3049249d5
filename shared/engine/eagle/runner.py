"""EagleRunner: ModelRunner for an EAGLE-3 head, which reads target features beside the tokens.

Per sequence it keeps the input feature of every committed position and the
head's outputs at the speculative rows (``_FeatureState``)::

    position p (committed)   token x_p   feature row p = fc(target f_{p-1})   (row 0: zeros)
    tree node j              token d_j   feature = the head's output at j's parent (root: position n-1)

Target rows arrive with the tokens they belong to (``add_features``); a
committed position whose target row has not come yet may run on the head's
own output instead (an optimistic commit along a drafted path, FASER §4.3),
and is re-run once the target's row arrives. Committing accepted tokens never
keeps the tree's KV for positions the target has now described: EAGLE
re-runs them with the true features (the "draft-extend" step), which is what
keeps acceptance up after the first drafted token.

Prefix caching: position p's KV is a function of token x_p and row p, and row p of tokens 0..p-1 once it
is the target's exact row, so a block whose every position ran on an exact row depends on its tokens'
prefix only. ``_FeatureState.exact_kv`` counts the leading KV positions that did; only blocks below it
enter the prefix index (``_registrable``), so KV computed from a provisional row, a tree node's or an
optimistic commit's, is never shared; a rollback or a re-run only lowers it. A prefill the cache serves
P positions of needs rows from position P on: its block may start at f_{P-1} (``start_features_at``).
"""

from __future__ import annotations

import torch

from shared.engine.config import EngineConfig
from shared.engine.eagle.model import Eagle3Head
from shared.engine.early_exit import EarlyExitController
from shared.engine.errors import InvalidRequestError
from shared.engine.features import FeatureBlock, FeatureSpec
from shared.engine.runner import ForwardOutput, ModelRunner, Work
from shared.engine.sequence import Sequence
from shared.engine.types import SamplingParams


class _FeatureState:
    """Input features of one sequence's committed positions, and the head's outputs at its tree rows."""

    def __init__(self, hidden: int, dtype: torch.dtype, device: torch.device) -> None:
        self.fused = torch.zeros(64, hidden, dtype=dtype, device=device)  # [cap, H] row p feeds position p
        self.num_rows = 1  # rows 0 .. num_rows-1 are set (row 0: zeros, the first token has no predecessor)
        self.num_exact = 0  # target rows received: f_0 .. f_{num_exact-1} (rows 1 .. num_exact)
        self.exact_kv = 0  # KV positions 0 .. exact_kv-1 ran on exact rows (what the prefix index may take)
        self.first_row = 1  # rows 1 .. first_row-1 are not here: their positions came from the prefix cache
        self.out = torch.zeros(8, hidden, dtype=dtype, device=device)  # [cap, H] row 0 root, row j+1 node j
        self.num_out = 0  # output rows valid for the current tree

    def _grow(self, name: str, rows: int) -> None:
        t = getattr(self, name)
        if rows > t.shape[0]:
            bigger = t.new_zeros(max(rows, 2 * t.shape[0]), t.shape[1])
            bigger[: t.shape[0]] = t
            setattr(self, name, bigger)

    def set_rows(self, start: int, rows: torch.Tensor) -> None:
        self._grow("fused", start + rows.shape[0])
        self.fused[start : start + rows.shape[0]] = rows
        self.num_rows = max(self.num_rows, start + rows.shape[0])

    def set_out(self, start: int, rows: torch.Tensor) -> None:
        self._grow("out", start + rows.shape[0])
        self.out[start : start + rows.shape[0]] = rows
        self.num_out = max(self.num_out, start + rows.shape[0])

    def truncate(self, num_committed: int) -> None:
        self.num_rows = min(self.num_rows, num_committed + 1)
        self.num_exact = min(self.num_exact, num_committed)
        self.num_out = 0


class EagleRunner(ModelRunner):
    def __init__(
        self,
        head: Eagle3Head,
        config: EngineConfig | None = None,
        *,
        name: str = "draft:eagle3",
        feature_dtype: str = "float16",
    ) -> None:
        super().__init__(head, config, name=name)
        self.head = head
        self.spec = FeatureSpec(tuple(head.cfg.aux_layer_ids), feature_dtype)
        self.feature_width = head.cfg.feature_width
        self.state: dict[str, _FeatureState] = {}
        self._batch: list[tuple[Sequence, torch.Tensor, torch.Tensor]] = []
        ids = head.draft_to_target
        # the draft vocabulary's token ids: the logits stay over it (8,192 columns for SmolLM2's head against
        # 49,152), and the drafters map the columns they pick (ForwardOutput.vocab_ids): ranking, softmax and
        # top-k over the full vocabulary's -inf columns were 40 % of a beam tree's drafting on 2 CPU cores
        self.logit_ids = None if torch.equal(ids.cpu(), torch.arange(self.vocab_size)) else ids.cpu()

    # ------------------------------------------------------------------ sequences

    def add(self, seq_id: str, token_ids: list[int], sampling: SamplingParams | None = None, cache_salt=None) -> Sequence:
        # prefix caching as on the target, but a block enters the index only once every position in it ran
        # on the target's exact row (_registrable): KV from the head's provisional guesses is never shared
        seq = super().add(seq_id, token_ids, sampling, cache_salt=cache_salt)
        self.state[seq_id] = _FeatureState(self.head.cfg.hidden_size, self.dtype, self.device)
        return seq

    def release(self, seq_id: str) -> None:
        super().release(seq_id)
        self.state.pop(seq_id, None)

    @torch.inference_mode()  # the feature state grows inside forwards: its tensors are inference tensors
    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        super().truncate(seq, num_tokens)
        if num_tokens:  # nothing rolled back keeps the head's outputs: a lookahead commit needs them (FASER §4.3)
            st = self.state[seq.seq_id]
            st.truncate(seq.num_committed)
            st.exact_kv = min(st.exact_kv, seq.num_cached)

    def start_features_at(self, seq: Sequence, start: int) -> None:
        """A fresh sequence whose prefix cache serves positions 0..start: its rows start at f_start."""
        st = self.state[seq.seq_id]
        st.num_exact = st.num_rows = start  # as if f_0 .. f_{start-1} had come (their positions are cached)
        st.first_row = start + 1

    def check_features(
        self, seq: Sequence, block: FeatureBlock, *, num_committed: int, rollback: int = 0, ahead: bool = False
    ) -> None:
        """Raise InvalidRequestError unless ``block`` fits ``seq`` once ``rollback`` and new tokens are applied.

        The target has run every committed token but the last, so rows end at ``num_committed - 1``; a
        prefill (``ahead``) may bring one more, the row of its last prompt token."""
        where = f"sequence {seq.seq_id!r}"
        if block.dtype != self.spec.dtype:
            raise InvalidRequestError(f"{where}: features in {block.dtype}, this draft reads {self.spec.dtype}")
        if block.width != self.feature_width:
            raise InvalidRequestError(
                f"{where}: features of width {block.width}, this head reads {self.feature_width} "
                f"({len(self.spec.layer_ids)} layers x the target's hidden size {self.head.cfg.target_hidden_size})"
            )
        exact = min(self.state[seq.seq_id].num_exact, seq.num_committed - rollback)
        if block.start > exact:
            raise InvalidRequestError(
                f"{where}: features start at position {block.start}, but the draft has the target's features of "
                f"positions 0..{exact - 1} only (rows must follow on without a gap)"
            )
        limit = num_committed if ahead else num_committed - 1
        if block.end > limit:
            raise InvalidRequestError(
                f"{where}: features for positions up to {block.end - 1}, but with {num_committed} tokens committed "
                f"the target has run positions up to {limit - 1} only"
            )

    @torch.inference_mode()
    def add_features(self, seq: Sequence, block: FeatureBlock, *, ahead: bool = False) -> None:
        """Take the target's rows f_start .. f_end-1 (they feed positions start+1 .. end); re-run what they change."""
        self.check_features(seq, block, num_committed=seq.num_committed, ahead=ahead)
        if not block.num_rows:
            return
        st = self.state[seq.seq_id]
        fused = self.head.fuse(block.to_tensor(self.device).to(self.dtype))  # [rows, H]
        first_new = max(block.start, st.num_exact) + 1  # rows before this were exact already: same values
        st.set_rows(block.start + 1, fused)
        st.num_exact = max(st.num_exact, block.end)
        if first_new <= block.end and first_new < seq.num_cached:
            seq.num_cached = first_new  # those positions ran on the head's own guesses: run them again
            st.exact_kv = min(st.exact_kv, first_new)
            seq.tree.clear()
            st.num_out = 0

    @torch.inference_mode()  # writes provisional rows into the feature state (inference tensors once grown)
    def commit(self, seq: Sequence, tokens: list[int]) -> int:
        """Append tokens; positions along a drafted path keep the head's outputs as their (provisional) features."""
        st = self.state[seq.seq_id]
        n = seq.num_committed
        path: list[int] = []  # the tree nodes spelling the tokens' prefix (what the base commit reuses)
        if seq.num_cached == n and st.num_out:
            node = -1
            for token in tokens:
                child = seq.tree.child(node, token)
                if child is None:
                    break
                path.append(child)
                node = child
        outs = st.out[: st.num_out].clone() if st.num_out and seq.num_cached == n else None
        reused = super().commit(seq, tokens)
        if outs is not None:
            # position n+i is fed the output at position n+i-1: the root's for i = 0, then path node i-1's
            rows = [0] + [j + 1 for j in path[:reused]]
            for i in range(min(len(tokens), len(rows))):
                if n + i > st.num_exact and rows[i] < outs.shape[0]:
                    st.set_rows(n + i, outs[rows[i]][None])
        st.num_out = 0
        return reused

    # ------------------------------------------------------------------ forward

    def forward(
        self,
        works: list[Work],
        early_exit: EarlyExitController | None = None,
        feature_layers: tuple[int, ...] | None = None,
    ) -> ForwardOutput:
        self._batch = []
        try:
            return super().forward(works, early_exit=None)
        finally:
            self._batch = []

    def _work_inputs(self, seq: Sequence, fed_pos: torch.Tensor, node_ids: torch.Tensor) -> None:
        if len(fed_pos):
            self.check_fed_rows(seq, int(fed_pos[0]), int(fed_pos[-1]))
        self._batch.append((seq, fed_pos, node_ids))

    def check_fed_rows(self, seq: Sequence, first: int, last: int) -> None:
        """Raise InvalidRequestError unless positions ``first .. last`` have their input rows."""
        st = self.state[seq.seq_id]
        if last >= st.num_rows:
            raise InvalidRequestError(
                f"sequence {seq.seq_id!r}: no target features for position {st.num_rows} onward; a feature draft "
                f"needs the target's features of every committed token it runs"
            )
        if max(first, 1) < st.first_row:
            raise InvalidRequestError(
                f"sequence {seq.seq_id!r}: no target features for positions {max(first, 1)}.."
                f"{st.first_row - 1}: they start at f_{st.first_row - 1}, and the prefix cache no longer holds "
                f"the positions before it; send the features from position 0"
            )

    def _ran(self, seq: Sequence, attached_from: int, first_fed: int) -> None:
        st = self.state[seq.seq_id]
        exact = min(st.exact_kv, attached_from)
        if first_fed > attached_from and exact == attached_from:
            exact = first_fed  # served by the prefix cache: indexed blocks hold exact KV only
        if exact >= first_fed:  # fed positions p ran on exact rows while p <= num_exact
            exact = max(first_fed, min(seq.num_cached, st.num_exact + 1))
        st.exact_kv = exact

    def _registrable(self, seq: Sequence) -> int:
        return self.state[seq.seq_id].exact_kv

    def _decode(self, ids: torch.Tensor, pos: torch.Tensor, layout) -> torch.Tensor:
        feats: list[torch.Tensor] = []
        for seq, fed_pos, node_ids in self._batch:
            st = self.state[seq.seq_id]
            feats.append(st.fused[fed_pos.to(self.device)])
            if len(node_ids):
                parent_rows = torch.tensor([seq.tree.parent_ids[j] + 1 for j in node_ids.tolist()], device=self.device)
                if int(parent_rows.max()) >= st.num_out and not len(fed_pos):
                    raise InvalidRequestError(f"sequence {seq.seq_id!r}: tree node before its parent ran")
                feats.append(st.out[parent_rows])
        x = torch.cat(feats)[None]  # [1, T, H]
        out = self.head(ids, x, pos, backend=self.backend)[0]  # [T, H] pre-norm
        offset = 0
        for seq, fed_pos, node_ids in self._batch:
            st = self.state[seq.seq_id]
            nf, nn_ = len(fed_pos), len(node_ids)
            if nf:
                st.set_out(0, out[offset + nf - 1][None])  # the last committed token's output: the root
            if nn_:
                st.set_out(int(node_ids[0]) + 1, out[offset + nf : offset + nf + nn_])
            offset += nf + nn_
        return out

    def _logits(self, works: list[Work], hidden: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.head.norm(hidden[rows])).float()  # [N, draft_vocab]: columns are logit_ids
