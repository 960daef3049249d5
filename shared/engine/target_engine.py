"""The target side: prefill, then verify per-request token trees, all in one batched forward.

    step(prefills, verifies)
      validate everything ──▶ one forward (prompts | bonus token + tree per request)
      ──▶ accept (greedy walk or multi-round rejection sampling) ──▶ commit accepted path

With ``early_exit`` enabled the forward may stop tree nodes at an
intermediate layer (FASER §4.2, ``early_exit.py``); acceptance treats them as
rejected, so the output is unchanged.

``resize_kv`` grows the KV pool into the space of an offloaded co-located
draft and shrinks it back before the draft reloads (Nightjar §5.1), between
``runner.base_blocks`` and ``runner.max_blocks`` (EngineConfig.kv_grow_blocks).

Nothing is mutated before every item has been validated, and a failed
forward releases the sequences it had just added, so a bad request costs
the caller an error and nothing else.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

from shared.engine import chunks, cuda_graphs, grammar_mask, static_step, tuned_lens
from shared.engine.acceptance import validate_child_dists
from shared.engine.early_exit import EarlyExitConfig, EarlyExitController, layer_outcomes, prune_outcome
from shared.engine.errors import ContextLengthError, DuplicateSequenceError, InvalidRequestError, KVPoolSizeError
from shared.engine.features import FeatureBlock, FeatureSpec
from shared.engine.runner import ModelRunner, Work
from shared.engine.static_step import StaticStep
from shared.engine.sampling import make_generator, validate_sampling
from shared.engine.token_logprobs import prompt_logprobs
from shared.engine.tree import children_of, validate_tree
from shared.engine.tuned_lens import TunedLens
from shared.engine.types import AcceptResult, ForwardCost, PrefillItem, PrefillResult, TokenLogprobs, VerifyItem
from shared.engine.verify_rows import first_token, verify_sequence

log = logging.getLogger(__name__)
LOG_EVERY = 500  # verified requests between two early-exit log lines


@dataclass
class TargetStepOutput:
    prefills: list[PrefillResult] = field(default_factory=list)
    verifies: list[AcceptResult] = field(default_factory=list)
    cost: ForwardCost | None = None

    @property
    def early_exit_ratio(self) -> float:
        """Share of the verified tree nodes that early exit stopped before the last layer."""
        drafted = sum(len(v.node_status) for v in self.verifies)
        return sum(v.num_pruned for v in self.verifies) / drafted if drafted else 0.0


class TargetEngine:
    def __init__(
        self, runner: ModelRunner, *, max_tree_nodes: int = 256, early_exit: EarlyExitConfig | None = None
    ):
        self.runner = runner
        self.max_tree_nodes = max_tree_nodes
        # greedy verify steps with one host read (static_step.py); None: every step is eager
        self.static: StaticStep | None = None
        if runner.config.static_step and static_step.supported(runner):
            self.static = StaticStep(runner, graphs=cuda_graphs.pool_for(runner))
            if self.static.graphs is not None and runner.config.graph_warmup:
                with torch.inference_mode():
                    self.static.graphs.warm(self.static, self.static.warm_buckets())
        self.early_exit: EarlyExitController | None = None
        self.set_early_exit(early_exit)
        self.pending: set[str] = set()  # sequences in the middle of a chunked prefill (no verify until it ends)
        self.step_paths: dict[str, int] = {"static": 0, "eager": 0}  # verify steps by path (services/engine_metrics.py)
        self.grammars = None  # grammar.GrammarBook: structured output (the factory sets it when there is a tokenizer)

    def set_early_exit(self, config: EarlyExitConfig | None, source: Path | None = None) -> None:
        """Turn token-wise early exit on (with ``config``) or off (None or disabled).

        ``source``: the target's model directory, where ``lens=auto`` looks for a tuned lens. Raises
        ValueError when ``config.lens`` names a directory without a usable lens (or one of another width)."""
        self.runner.exit_lens = None
        if config is None or not config.enabled:
            self.early_exit = None
            return
        num_layers = len(self.runner.decoder.layers)
        lens = self._exit_lens(config.lens, source)
        if lens is not None:
            hidden = self.runner.decoder.embed_tokens.embedding_dim
            if lens.hidden_size != hidden or lens.layers[-1] >= num_layers - 1:
                raise ValueError(f"tuned lens of width {lens.hidden_size}, layers {lens.layers} does not fit a target "
                                 f"of width {hidden} and {num_layers} layers")  # fmt: skip
            lens.attach_head(self.runner.lm_head.weight)
        self.runner.exit_lens = lens
        self.early_exit = EarlyExitController(config, num_layers, lens.layers if lens is not None else None)

    def _exit_lens(self, spec: str, source: Path | None) -> TunedLens | None:
        spec = spec.strip()
        if spec.lower() in ("off", "none", "false", ""):
            return None
        if spec.lower() == "auto":
            if source is None or not Path(source).is_dir():
                return None
            return tuned_lens.load(Path(source), device=self.runner.device, dtype=self.runner.dtype)
        lens = tuned_lens.load(Path(spec), device=self.runner.device, dtype=self.runner.dtype)
        if lens is None:
            raise ValueError(f"early exit lens={spec!r}: no {tuned_lens.FILE_NAME} there")
        return lens

    def prefill(self, items: list[PrefillItem], features: FeatureSpec | None = None) -> list[PrefillResult]:
        return self.step(items, [], features).prefills

    def verify(self, items: list[VerifyItem], features: FeatureSpec | None = None) -> list[AcceptResult]:
        return self.step([], items, features).verifies

    def features(self, seq_ids: list[str], spec: FeatureSpec) -> list[FeatureBlock]:
        """Recompute the features of every committed token each sequence has run (positions 0 .. n-2).

        For a feature draft that lost its state (a restart): it is rebuilt
        from these. One prefill-sized forward over scratch copies of the
        sequences; their KV blocks are freed before this returns, and the
        sequences themselves are not touched.
        """
        if len(seq_ids) != len(set(seq_ids)):
            raise InvalidRequestError("a sequence appears twice in one features call")
        prefixes = [self.runner.get(s).token_ids[:-1] for s in seq_ids]
        scratch = []
        try:
            for seq_id, prefix in zip(seq_ids, prefixes):
                scratch.append(self.runner.add(f"\x00features:{seq_id}", prefix, cache_salt=None))
            out = self.runner.forward([Work(seq) for seq in scratch], feature_layers=spec.layer_ids)
        finally:
            for seq in scratch:
                self.runner.release(seq.seq_id)
        return [
            FeatureBlock.from_tensor(out.features[row : row + n], start, spec.dtype) for row, n, start in out.fed
        ]

    def release(self, seq_ids: list[str]) -> None:
        for seq_id in seq_ids:
            self.runner.release(seq_id)
            self.pending.discard(seq_id)
            if self.early_exit is not None:
                self.early_exit.forget(seq_id)

    def resize_kv(self, num_blocks: int) -> int:
        """Set the KV pool to ``num_blocks`` in [base_blocks, max_blocks]; returns its bytes after.

        Shrinking raises KVBlocksInUseError, pool unchanged, while a live sequence owns a block past the new end.
        """
        runner = self.runner
        if not runner.base_blocks <= num_blocks <= runner.max_blocks:
            raise KVPoolSizeError(
                f"KV pool size {num_blocks} is outside [{runner.base_blocks}, {runner.max_blocks}] blocks "
                f"(start-up size, + kv_grow_blocks {runner.max_blocks - runner.base_blocks})"
            )
        pool_bytes = runner.cache.resize(num_blocks)
        if runner.device.type == "cuda":
            torch.cuda.empty_cache()  # a shrink's freed space goes back to the device, for the draft to take
        return pool_bytes

    def _validate(self, prefills: list[PrefillItem], verifies: list[VerifyItem]) -> None:
        ids = [p.seq_id for p in prefills] + [v.seq_id for v in verifies]
        if len(ids) != len(set(ids)):
            raise InvalidRequestError("a sequence appears twice in one step")
        vocab = self.runner.vocab_size
        for p in prefills:
            if p.resume:
                chunks.check_resume(self.runner, self.pending, p)
                continue
            chunks.check_chunk(p)
            if p.seq_id in self.runner.seqs:
                raise DuplicateSequenceError(f"sequence {p.seq_id!r} is already live")
            if not p.prompt_ids:
                raise InvalidRequestError(f"sequence {p.seq_id!r}: empty prompt")
            self.runner.check_tokens(p.prompt_ids, what=f"sequence {p.seq_id!r}")
            validate_sampling(p.sampling)
            if p.num_prompt_tokens is not None and not 1 <= p.num_prompt_tokens <= len(p.prompt_ids):
                raise InvalidRequestError(f"sequence {p.seq_id!r}: num_prompt_tokens {p.num_prompt_tokens} is not "
                                          f"in [1, {len(p.prompt_ids)}]")  # fmt: skip
            # checked here, not only in add(): a later item failing must not strand the earlier ones
            if len(p.prompt_ids) > self.runner.max_context:
                raise ContextLengthError(
                    f"sequence {p.seq_id!r}: prompt of {len(p.prompt_ids)} tokens exceeds the context window of "
                    f"{self.runner.max_context}"
                )
        for v in verifies:
            self.runner.get(v.seq_id)
            if v.seq_id in self.pending:
                raise InvalidRequestError(f"sequence {v.seq_id!r}: its chunked prefill has not finished")
            tree = v.tree
            if len(tree) > self.max_tree_nodes:
                raise InvalidRequestError(
                    f"sequence {v.seq_id!r}: tree of {len(tree)} nodes exceeds the limit of {self.max_tree_nodes}"
                )
            if len(tree.parent_ids) != len(tree.token_ids):
                raise InvalidRequestError(
                    f"sequence {v.seq_id!r}: {len(tree.token_ids)} tree tokens but {len(tree.parent_ids)} parents"
                )
            validate_tree(tree.token_ids, tree.parent_ids, vocab)
            validate_child_dists(tree, children_of(tree.parent_ids), vocab)

    def _static_eligible(self, prefills: list[PrefillItem], verifies: list[VerifyItem], features) -> bool:
        """A verify-only step with nothing the static path leaves to the eager forward (static_step.py)."""
        return not (self.static is None or prefills or not verifies or features is not None or self.early_exit is not None)

    def step(
        self, prefills: list[PrefillItem], verifies: list[VerifyItem], features: FeatureSpec | None = None
    ) -> TargetStepOutput:
        """``features``: also return, per sequence, the features of the tokens this step ran and committed."""
        self._validate(prefills, verifies)
        grammars = grammar_mask.compile_prefills(self.grammars, prefills)
        verifies, kept = grammar_mask.prune_verifies(self.runner.seqs, verifies)  # nodes the grammar rejects
        if self._static_eligible(prefills, verifies, features):
            accepted, cost = self.static.run(verifies)
            self.step_paths["static"] += 1
            return TargetStepOutput(verifies=grammar_mask.unprune(accepted, kept), cost=cost)
        self.step_paths["eager"] += bool(verifies)
        fresh = [p for p in prefills if not p.resume]
        added = [self.runner.add(p.seq_id, p.prompt_ids, p.sampling, p.cache_salt) for p in fresh]
        for seq, p in zip(added, fresh):
            seq.generator = make_generator(seq.sampling.seed)
            seq.output_start = len(p.prompt_ids) if p.num_prompt_tokens is None else p.num_prompt_tokens
            seq.grammar = grammars.get(seq.seq_id)  # built now, first used when the (chunked) prefill completes
        prefill_seqs = [self.runner.get(p.seq_id) for p in prefills]
        before = [seq.num_cached for seq in prefill_seqs]
        verify_seqs = [self.runner.get(v.seq_id) for v in verifies]
        # prompt log-probabilities need the whole prompt in one forward: such a prefill is never chunked
        works = [Work(seq, want_root=True, want_fed=seq.sampling.prompt_logprobs is not None,
                      max_fed=None if seq.sampling.prompt_logprobs is not None else p.max_tokens or None)
                 for seq, p in zip(prefill_seqs, prefills)] + [  # fmt: skip
            Work(seq, new_nodes=list(zip(v.tree.token_ids, v.tree.parent_ids)), want_root=True, want_nodes=True)
            for seq, v in zip(verify_seqs, verifies)
        ]
        ee = self.early_exit
        if ee is not None:
            ee.begin([v.seq_id for v in verifies], [len(v.tree) for v in verifies])
        try:
            out = self.runner.forward(
                works,
                early_exit=ee if any(len(v.tree) for v in verifies) else None,
                feature_layers=features.layer_ids if features is not None else None,
            )
        except BaseException:
            for seq in added:
                self.runner.release(seq.seq_id)
            raise

        result = TargetStepOutput(cost=out.cost)
        for i, seq in enumerate(prefill_seqs):
            done = out.root_rows[i] is not None
            (self.pending.discard if done else self.pending.add)(seq.seq_id)
            token, logprobs, prompt = -1, None, None
            if done:
                token, logprobs = first_token(seq, out.root(i))
                prompt = _prompt_logprobs(out, i, seq)
            progress = chunks.progress(seq, before[i], out.fed[i][1])  # (num_prefilled, num_cached)
            if done:
                self.runner.commit(seq, [token])
            block = _committed_features(out, i, [], features)
            result.prefills.append(PrefillResult(seq.seq_id, token, block, not done, *progress, logprobs=logprobs,
                                                 prompt_logprobs=prompt))  # fmt: skip
        for j, (seq, v) in enumerate(zip(verify_seqs, verifies)):
            i = len(prefill_seqs) + j
            rows = out.logits[out.root_rows[i] : out.root_rows[i] + 1 + len(v.tree)]  # [1 + num_nodes, vocab]
            accepted = verify_sequence(seq, v.tree, rows, out.pruned[i])
            accepted.features = _committed_features(out, i, accepted.accepted_nodes, features)
            self.runner.commit(seq, accepted.tokens)
            if ee is not None and len(v.tree):
                flags = out.flags[i] if out.flags else []
                shadow = [node for node, _, was_pruned in flags if not was_pruned]
                args = (v.tree.parent_ids, v.tree.token_ids, accepted.accepted_nodes, accepted.tokens[-1])
                outcome = prune_outcome(*args, accepted.pruned_nodes, shadow)
                ee.observe_outcome(outcome, layer_outcomes(*args, flags))
                ee.observe_accept(seq.seq_id, len(v.tree), accepted.num_accepted, outcome.pruned_passed)
            result.verifies.append(accepted)
        if ee is not None and verifies and ee.stats.verifies // LOG_EVERY != (ee.stats.verifies - len(verifies)) // LOG_EVERY:
            log.info(ee.describe())
        grammar_mask.unprune(result.verifies, kept)
        return result


def _prompt_logprobs(out, i: int, seq) -> list[TokenLogprobs] | None:
    """Work i's prompt tokens 1 .. output_start - 1 under the model, when its sampling asks for them."""
    start = out.fed_rows[i] if out.fed_rows else None
    if start is None:
        return None
    num_fed = out.fed[i][1]  # a prefill feeds from position 0
    rows = out.logits[start : start + num_fed - 1][: seq.output_start - 1]  # [P - 1, vocab]
    return prompt_logprobs(rows, seq.token_ids[: seq.output_start], seq.sampling.prompt_logprobs)


def _committed_features(out, i: int, accepted_nodes: list[int], spec: FeatureSpec | None) -> FeatureBlock | None:
    """Work i's feature rows for what it committed: the positions the prefix cache served (their stored rows),
    the fed tokens, then the accepted path (consecutive positions), as a full recompute would give them."""
    if spec is None or out.features is None:
        return None
    row, num_fed, start = out.fed[i]
    packed = list(range(row, row + num_fed)) + [out.node_packed[i] + j for j in accepted_nodes]
    index = torch.tensor(packed, dtype=torch.long, device=out.features.device)
    rows = out.features[index]  # [num_fed + num_accepted, width]
    served = out.feature_prefix[i] if out.feature_prefix else None  # [num_served, width]
    if served is not None:
        rows, start = torch.cat([served.to(rows.dtype), rows]), start - served.shape[0]
    return FeatureBlock.from_tensor(rows, start, spec.dtype)
