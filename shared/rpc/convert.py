"""Protobuf messages <-> engine dataclasses (shared.engine.types), in one place.

The model services translate requests with ``*_from_pb`` and responses with
``*_to_pb``; the scheduler's gRPC workers do the reverse. Malformed messages
(lengths that disagree) raise ``InvalidRequestError``, which the error
interceptor turns into INVALID_ARGUMENT.

Node status: the engine writes 1 / 0 / -1 (accepted / rejected / unreached);
the wire uses ``NodeStatus`` enum values.
"""

from __future__ import annotations

import time

import shared.rpc  # noqa: F401 - builds the generated code if needed
from shared.engine.errors import InvalidRequestError
from shared.engine.features import FeatureBlock, FeatureSpec
from shared.engine.types import (
    AcceptResult,
    ForwardCost,
    GrammarSpec,
    PrefillItem,
    PrefillResult,
    SamplingParams,
    SparseDist,
    SpecItem,
    TokenLogprobs,
    TokenTree,
    VerifyItem,
)
from shared.rpc.gen.tandem.v1 import common_pb2, draft_pb2, target_pb2

_STATUS_TO_PB = {
    1: target_pb2.NODE_STATUS_ACCEPTED,
    0: target_pb2.NODE_STATUS_REJECTED,
    -1: target_pb2.NODE_STATUS_UNREACHED,
}
_STATUS_FROM_PB = {v: k for k, v in _STATUS_TO_PB.items()}


# --- sampling -------------------------------------------------------------


def sampling_to_pb(params: SamplingParams) -> common_pb2.SamplingParams:
    msg = common_pb2.SamplingParams(
        temperature=params.temperature, top_p=params.top_p, top_k=params.top_k, min_p=params.min_p,
        frequency_penalty=params.frequency_penalty, presence_penalty=params.presence_penalty,
        min_tokens=params.min_tokens, stop_token_ids=list(params.stop_token_ids),
    )  # fmt: skip
    for name in ("seed", "logprobs", "prompt_logprobs"):
        if getattr(params, name) is not None:
            setattr(msg, name, getattr(params, name))
    if params.repetition_penalty != 1.0:
        msg.repetition_penalty = params.repetition_penalty
    return msg


def sampling_from_pb(msg: common_pb2.SamplingParams) -> SamplingParams:
    """Unset top_p / repetition_penalty read as 1.0; an unset message (default instance) is greedy."""
    return SamplingParams(
        temperature=msg.temperature,
        top_p=msg.top_p if msg.HasField("top_p") else 1.0,
        seed=msg.seed if msg.HasField("seed") else None,
        top_k=msg.top_k,
        min_p=msg.min_p,
        repetition_penalty=msg.repetition_penalty if msg.HasField("repetition_penalty") else 1.0,
        frequency_penalty=msg.frequency_penalty,
        presence_penalty=msg.presence_penalty,
        min_tokens=msg.min_tokens,
        stop_token_ids=tuple(msg.stop_token_ids),
        logprobs=msg.logprobs if msg.HasField("logprobs") else None,
        prompt_logprobs=msg.prompt_logprobs if msg.HasField("prompt_logprobs") else None,
    )


def logprobs_to_pb(lp: TokenLogprobs) -> common_pb2.TokenLogprobs:
    return common_pb2.TokenLogprobs(
        token_id=lp.token_id, logprob=lp.logprob, top_ids=list(lp.top_ids), top_logprobs=list(lp.top_logprobs)
    )


def logprobs_from_pb(msg: common_pb2.TokenLogprobs) -> TokenLogprobs:
    if len(msg.top_ids) != len(msg.top_logprobs):
        raise InvalidRequestError(f"{len(msg.top_ids)} top_ids but {len(msg.top_logprobs)} top_logprobs")
    return TokenLogprobs(msg.token_id, msg.logprob, tuple(msg.top_ids), tuple(msg.top_logprobs))


# --- trees ----------------------------------------------------------------


def tree_to_pb(tree: TokenTree) -> common_pb2.TokenTree:
    msg = common_pb2.TokenTree(
        token_ids=tree.token_ids, parent_ids=tree.parent_ids, draft_probs=[float(p) for p in tree.draft_probs]
    )
    for row in sorted(tree.child_dists):
        dist = tree.child_dists[row]
        if dist is None:
            continue
        msg.child_dists.add(row=row, token_ids=_values(dist.token_ids), probs=_values(dist.probs))
    return msg


def _values(x) -> list:
    """A distribution's numbers for the wire: a tensor's, or the lists a relay kept (``tree_from_pb(relay=True)``)."""
    return x.tolist() if hasattr(x, "tolist") else list(x)


def tree_from_pb(msg: common_pb2.TokenTree, *, relay: bool = False) -> TokenTree:
    """Structure (parents before children, in range) is the engine's to validate.

    ``relay``: the caller only passes the tree on (the scheduler, draft to target), so each child
    distribution keeps the wire's lists instead of becoming tensors: the scheduler never imports torch."""
    n = len(msg.token_ids)
    if len(msg.parent_ids) != n:
        raise InvalidRequestError(f"token tree has {n} token_ids but {len(msg.parent_ids)} parent_ids")
    if msg.draft_probs and len(msg.draft_probs) != n:
        raise InvalidRequestError(f"token tree has {n} nodes but {len(msg.draft_probs)} draft_probs")
    child_dists: dict[int, SparseDist] = {}
    for entry in msg.child_dists:
        if entry.row > n:
            raise InvalidRequestError(f"child_dists row {entry.row} outside a tree of {n} nodes")
        if len(entry.token_ids) != len(entry.probs):
            raise InvalidRequestError(
                f"child_dists row {entry.row}: {len(entry.token_ids)} ids, {len(entry.probs)} probs"
            )
        if entry.row in child_dists:
            raise InvalidRequestError(f"child_dists row {entry.row} given twice")
        if relay:
            child_dists[entry.row] = SparseDist(token_ids=list(entry.token_ids), probs=list(entry.probs))
            continue
        import torch  # the engines' side only

        child_dists[entry.row] = SparseDist(
            token_ids=torch.tensor(list(entry.token_ids), dtype=torch.int64),  # [k]
            probs=torch.tensor(list(entry.probs), dtype=torch.float32),  # [k]
        )
    return TokenTree(
        token_ids=list(msg.token_ids),
        parent_ids=list(msg.parent_ids),
        draft_probs=list(msg.draft_probs),
        child_dists=child_dists,
    )


# --- features (feature-level drafts) ---------------------------------------

_DTYPE_TO_PB = {
    "float16": common_pb2.FEATURE_DTYPE_FLOAT16,
    "bfloat16": common_pb2.FEATURE_DTYPE_BFLOAT16,
    "float32": common_pb2.FEATURE_DTYPE_FLOAT32,
}
_DTYPE_FROM_PB = {v: k for k, v in _DTYPE_TO_PB.items()}


def _dtype_from_pb(value: int, where: str) -> str:
    dtype = _DTYPE_FROM_PB.get(value)
    if dtype is None:
        raise InvalidRequestError(f"{where}: feature dtype {value} is not a FeatureDtype (set float16, bfloat16 or float32)")
    return dtype


def feature_spec_to_pb(spec: FeatureSpec) -> common_pb2.FeatureSpec:
    return common_pb2.FeatureSpec(layer_ids=list(spec.layer_ids), dtype=_DTYPE_TO_PB[spec.dtype])


def feature_spec_from_pb(msg: common_pb2.FeatureSpec) -> FeatureSpec:
    if not msg.layer_ids:
        raise InvalidRequestError("feature spec: no layer ids")
    return FeatureSpec(tuple(msg.layer_ids), _dtype_from_pb(msg.dtype, "feature spec"))


def feature_block_to_pb(block: FeatureBlock) -> common_pb2.FeatureBlock:
    return common_pb2.FeatureBlock(
        start=block.start, num_rows=block.num_rows, width=block.width, dtype=_DTYPE_TO_PB[block.dtype], data=block.data
    )


def feature_block_from_pb(msg: common_pb2.FeatureBlock, where: str, pushed: bool = False) -> FeatureBlock:
    """``pushed``: the rows past ``data`` come another way (a shared-memory ring, the target's push)."""
    try:
        return FeatureBlock(msg.start, msg.num_rows, msg.width, _dtype_from_pb(msg.dtype, where), bytes(msg.data),
                            pushed=pushed)  # fmt: skip
    except ValueError as exc:
        raise InvalidRequestError(f"{where}: {exc}") from None


def _features_of(msg, where: str) -> FeatureBlock | None:
    return feature_block_from_pb(msg.features, where) if msg.HasField("features") else None


# --- work items -----------------------------------------------------------


def prefill_item_to_pb(item: PrefillItem) -> common_pb2.PrefillItem:
    msg = common_pb2.PrefillItem(seq_id=item.seq_id, prompt_ids=item.prompt_ids, sampling=sampling_to_pb(item.sampling),
                                 max_tokens=item.max_tokens, resume=item.resume, cache_salt=item.cache_salt)
    if item.num_prompt_tokens is not None:
        msg.num_prompt_tokens = item.num_prompt_tokens
    if item.features is not None:
        msg.features.CopyFrom(feature_block_to_pb(item.features))
    if item.grammar is not None:
        msg.grammar.CopyFrom(grammar_to_pb(item.grammar))
    return msg


def prefill_item_from_pb(msg: common_pb2.PrefillItem) -> PrefillItem:
    return PrefillItem(
        seq_id=msg.seq_id,
        prompt_ids=list(msg.prompt_ids),
        sampling=sampling_from_pb(msg.sampling),
        features=_features_of(msg, f"sequence {msg.seq_id!r}"),
        max_tokens=msg.max_tokens,
        resume=msg.resume,
        cache_salt=msg.cache_salt,
        num_prompt_tokens=msg.num_prompt_tokens if msg.HasField("num_prompt_tokens") else None,
        grammar=grammar_from_pb(msg.grammar) if msg.HasField("grammar") else None,
    )


_GRAMMAR_KINDS = {common_pb2.GRAMMAR_KIND_JSON_OBJECT: "json_object", common_pb2.GRAMMAR_KIND_JSON_SCHEMA: "json_schema",
                  common_pb2.GRAMMAR_KIND_REGEX: "regex", common_pb2.GRAMMAR_KIND_CHOICE: "choice"}  # fmt: skip


def grammar_to_pb(spec: GrammarSpec) -> common_pb2.Grammar:
    kind = {name: value for value, name in _GRAMMAR_KINDS.items()}.get(spec.kind)
    if kind is None:
        raise InvalidRequestError(f"unknown grammar kind {spec.kind!r}")
    return common_pb2.Grammar(kind=kind, spec=spec.spec, start=spec.start)


def grammar_from_pb(msg: common_pb2.Grammar) -> GrammarSpec:
    kind = _GRAMMAR_KINDS.get(msg.kind)
    if kind is None:
        raise InvalidRequestError(f"grammar kind {msg.kind} is not one of JSON_OBJECT, JSON_SCHEMA, REGEX, CHOICE")
    return GrammarSpec(kind, msg.spec, msg.start)


def verify_item_to_pb(item: VerifyItem) -> target_pb2.VerifyItem:
    return target_pb2.VerifyItem(seq_id=item.seq_id, tree=tree_to_pb(item.tree))


def verify_item_from_pb(msg: target_pb2.VerifyItem) -> VerifyItem:
    return VerifyItem(seq_id=msg.seq_id, tree=tree_from_pb(msg.tree))


def spec_item_to_pb(item: SpecItem) -> draft_pb2.SpecItem:
    if item.chain_len and (item.tree_depth or item.tree_width):
        raise InvalidRequestError(f"{item.seq_id}: a speculation is a chain or a tree, not both")
    msg = draft_pb2.SpecItem(seq_id=item.seq_id, new_tokens=item.new_tokens, rollback=item.rollback)
    if item.features is not None:
        msg.features.CopyFrom(feature_block_to_pb(item.features))
    if item.chain_len:
        msg.chain.length = item.chain_len
        msg.chain.confidence_threshold = item.confidence_threshold
    elif item.tree_depth or item.tree_width:
        msg.tree.depth = item.tree_depth
        msg.tree.width = item.tree_width
        msg.tree.expansion.extend(item.tree_expansion)
    return msg


def spec_item_from_pb(msg: draft_pb2.SpecItem) -> SpecItem:
    item = SpecItem(
        seq_id=msg.seq_id,
        new_tokens=list(msg.new_tokens),
        rollback=msg.rollback,
        features=_features_of(msg, f"sequence {msg.seq_id!r}"),
    )
    shape = msg.WhichOneof("shape")
    if shape == "chain":
        item.chain_len = msg.chain.length
        item.confidence_threshold = msg.chain.confidence_threshold
    elif shape == "tree":
        item.tree_depth = msg.tree.depth
        item.tree_width = msg.tree.width
        item.tree_expansion = tuple(msg.tree.expansion)
    return item


# --- results --------------------------------------------------------------


def prefill_result_to_pb(result: PrefillResult) -> target_pb2.PrefillOutput:
    msg = target_pb2.PrefillOutput(seq_id=result.seq_id, first_token=result.first_token, pending=result.pending,
                                   num_prefilled=result.num_prefilled, num_cached=result.num_cached)
    if result.features is not None:
        msg.features.CopyFrom(feature_block_to_pb(result.features))
    if result.logprobs is not None:
        msg.logprobs.CopyFrom(logprobs_to_pb(result.logprobs))
    msg.prompt_logprobs.extend(logprobs_to_pb(lp) for lp in result.prompt_logprobs or ())
    return msg


def prefill_result_from_pb(msg: target_pb2.PrefillOutput) -> PrefillResult:
    """An empty prompt_logprobs reads as None (a one-token prompt has none either way)."""
    return PrefillResult(
        seq_id=msg.seq_id, first_token=msg.first_token, features=_features_of(msg, f"sequence {msg.seq_id!r}"),
        pending=msg.pending, num_prefilled=msg.num_prefilled, num_cached=msg.num_cached,
        logprobs=logprobs_from_pb(msg.logprobs) if msg.HasField("logprobs") else None,
        prompt_logprobs=[logprobs_from_pb(lp) for lp in msg.prompt_logprobs] or None,
    )  # fmt: skip


def accept_to_pb(seq_id: str, result: AcceptResult) -> target_pb2.VerifyOutput:
    msg = target_pb2.VerifyOutput(
        seq_id=seq_id,
        accepted_nodes=result.accepted_nodes,
        tokens=result.tokens,
        node_status=[_STATUS_TO_PB[s] for s in result.node_status],
        pruned_nodes=result.pruned_nodes,
    )
    if result.features is not None:
        msg.features.CopyFrom(feature_block_to_pb(result.features))
    msg.logprobs.extend(logprobs_to_pb(lp) for lp in result.logprobs or ())
    return msg


def accept_from_pb(msg: target_pb2.VerifyOutput) -> tuple[str, AcceptResult]:
    try:
        status = [_STATUS_FROM_PB[s] for s in msg.node_status]
    except KeyError as exc:
        raise InvalidRequestError(f"{msg.seq_id}: node status {exc.args[0]} is not a NodeStatus") from None
    return msg.seq_id, AcceptResult(
        accepted_nodes=list(msg.accepted_nodes),
        tokens=list(msg.tokens),
        node_status=status,
        pruned_nodes=list(msg.pruned_nodes),
        features=_features_of(msg, f"sequence {msg.seq_id!r}"),
        logprobs=[logprobs_from_pb(lp) for lp in msg.logprobs] or None,
    )


# --- costs and timing -----------------------------------------------------


def cost_to_pb(cost: ForwardCost) -> common_pb2.ForwardCost:
    return common_pb2.ForwardCost(
        duration_ns=round(cost.duration_s * 1e9),
        num_seqs=cost.num_seqs,
        num_batched_tokens=cost.num_batched_tokens,
        num_context_tokens=cost.num_context_tokens,
    )


def cost_from_pb(msg: common_pb2.ForwardCost) -> ForwardCost:
    return ForwardCost(
        duration_s=msg.duration_ns / 1e9,
        num_seqs=msg.num_seqs,
        num_batched_tokens=msg.num_batched_tokens,
        num_context_tokens=msg.num_context_tokens,
    )


class CallTimer:
    """Fills a response's ``Timing``: start it when the call arrives.

    timer = CallTimer()
    ... work ...
    return VerifyResponse(..., timing=timer.timing(forward_ns=fwd_ns))
    """

    def __init__(self) -> None:
        self.start_unix_ns = time.time_ns()
        self._start_ns = time.perf_counter_ns()

    def elapsed_ns(self) -> int:
        return time.perf_counter_ns() - self._start_ns

    def timing(self, *, queue_ns: int = 0, forward_ns: int = 0, sample_ns: int = 0) -> common_pb2.Timing:
        return common_pb2.Timing(
            queue_ns=queue_ns,
            forward_ns=forward_ns,
            sample_ns=sample_ns,
            total_ns=self.elapsed_ns(),
            start_unix_ns=self.start_unix_ns,
        )
