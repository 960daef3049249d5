"""Plain data that flows between the engine, the services and the scheduler.

A token tree hangs off the last committed token of a sequence::

    committed:  t0 t1 t2 ... t(n-1)          (n tokens, the KV cache holds them)
    tree:                        \\
                                  node0 (parent -1) ── node2 (parent 0)
                                  node1 (parent -1) ── node3 (parent 1) ── node4 (parent 3)

Node i has depth 0 when its parent is -1, else depth(parent) + 1; its
position id is n + depth. Parents always precede children (parent < i), which
is what makes the list a tree and lets every pass run front to back. A chain
of k tokens is the tree with parents [-1, 0, 1, ..., k-2].
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shared.engine.features import FeatureBlock

if TYPE_CHECKING:  # annotations only: the scheduler carries these types without importing torch
    import torch


@dataclass(frozen=True)
class SamplingParams:
    """How the target picks tokens; temperature 0 means greedy (argmax). Every default is neutral.

    The order the values act in (logits_process.py, then sampling.py): min_tokens mask, repetition penalty,
    frequency and presence penalties, registered logits processors, then / temperature, softmax, top-k,
    top-p, min-p. ``logprobs`` / ``prompt_logprobs``: how many alternatives to report per output / prompt
    token (None: no log-probabilities; 0: the chosen token's only).
    """

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    top_k: int = 0  # keep the k most probable tokens; 0 = all
    min_p: float = 0.0  # drop tokens with p < min_p * max p
    repetition_penalty: float = 1.0  # CTRL's: logits of tokens seen in prompt or output / r (x r when < 0)
    frequency_penalty: float = 0.0  # minus f x (times the token occurs in the output)
    presence_penalty: float = 0.0  # minus p x (the token occurs in the output)
    min_tokens: int = 0  # stop_token_ids are impossible before this many output tokens
    stop_token_ids: tuple[int, ...] = ()  # what min_tokens holds back (the request's stop ids, EOS among them)
    logprobs: int | None = None
    prompt_logprobs: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def uses_context(self) -> bool:
        """Whether a row's distribution depends on the tokens before it (penalties, min_tokens)."""
        return (self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0
                or (self.min_tokens > 0 and bool(self.stop_token_ids)))  # fmt: skip


@dataclass(frozen=True)
class TokenLogprobs:
    """The target's log-probability of one emitted (or prompt) token, and its ``top`` alternatives.

    ``logprob`` may be -inf (a token the sampling filters removed, reported for a prompt or forced token).
    """

    token_id: int
    logprob: float
    top_ids: tuple[int, ...] = ()
    top_logprobs: tuple[float, ...] = ()


@dataclass(frozen=True)
class GrammarSpec:
    """A constraint on what a request generates (structured output); compiled by shared/engine/grammar.py.

    ``kind`` is one of GRAMMAR_KINDS; ``spec`` the schema (JSON text), regex, or choices (a JSON list of
    strings); empty for json_object. ``start``: how many of the sequence's leading tokens (the prompt) lie
    outside the grammar; every token after them is constrained, so a re-prefill of prompt + output resumes
    the grammar where it was.
    """

    kind: str
    spec: str = ""
    start: int = 0


GRAMMAR_KINDS = ("json_object", "json_schema", "regex", "choice")


@dataclass
class SparseDist:
    """A probability distribution over a subset of the vocabulary (the rest is 0).

    The draft samples from exactly this distribution, so sending it instead of a
    dense vocabulary vector keeps rejection sampling exact.
    """

    token_ids: torch.Tensor  # [k] int64 (the scheduler, which only relays a tree, keeps the wire's list)
    probs: torch.Tensor  # [k] float32, sums to 1 (likewise)


@dataclass
class TokenTree:
    """Speculative tokens to verify, as node token ids plus parent indices.

    ``draft_probs[i]`` is the draft's conditional probability of node i given
    its path (AdaServe multiplies them into path probabilities).
    ``child_dists[j]`` is the distribution the children of row j were sampled
    from, where row 0 is the last committed token and row i+1 is node i; a
    missing entry or None means those children were chosen deterministically
    (greedy / beam search), which acceptance treats as point masses.
    """

    token_ids: list[int] = field(default_factory=list)
    parent_ids: list[int] = field(default_factory=list)
    draft_probs: list[float] = field(default_factory=list)
    child_dists: dict[int, SparseDist] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.token_ids)

    @staticmethod
    def chain(token_ids: list[int], draft_probs: list[float] | None = None) -> "TokenTree":
        return TokenTree(
            token_ids=list(token_ids),
            parent_ids=list(range(-1, len(token_ids) - 1)),
            draft_probs=list(draft_probs) if draft_probs is not None else [],
        )


@dataclass
class AcceptResult:
    """Outcome of verifying one request's tree.

    ``accepted_nodes`` is the root-to-node path of accepted node indices;
    ``tokens`` is what the request emits this step: the accepted tokens
    followed by the bonus token sampled from the target at the path's end.
    ``node_status[i]`` is 1 if node i was accepted, 0 if it was tested and
    rejected, -1 if it was never reached. ``pruned_nodes`` are the nodes
    token-wise early exit stopped before the last layer (reported rejected).
    """

    accepted_nodes: list[int]
    tokens: list[int]
    node_status: list[int]
    pruned_nodes: list[int] = field(default_factory=list)
    # target features of the tokens this step ran and committed (the fed token(s), then the accepted path);
    # only when the step was asked for them (feature-level drafts)
    features: FeatureBlock | None = None
    logprobs: list[TokenLogprobs] | None = None  # one per token of ``tokens``, when the sampling asks for them
    # draft relay (VerifyItem): the tree the target verified for a RELAY_TAKE item; whether the relayed tree
    # never came (a plain decode step ran; the draft's state of the sequence is unknown); whether this step's
    # tokens were handed to the draft (its next tree waits at the target)
    relay_tree: TokenTree | None = None
    relay_missed: bool = False
    relayed: bool = False

    @property
    def num_pruned(self) -> int:
        return len(self.pruned_nodes)

    @property
    def bonus_token(self) -> int:
        return self.tokens[-1]

    @property
    def num_accepted(self) -> int:
        return len(self.accepted_nodes)


@dataclass
class ForwardCost:
    """What one forward pass cost: the profiler fits T = a*N_context + g*N_batched + d on these."""

    duration_s: float
    num_seqs: int
    num_batched_tokens: int  # tokens run through the model this pass (prefill + decode + tree)
    num_context_tokens: int  # KV entries attended to, summed over sequences


# ---------------------------------------------------------------------------
# Per-iteration work items: what the scheduler asks of the model services.
# The same items are used in-process (TargetEngine / DraftEngine) and on the
# wire (the gRPC services translate protobuf <-> these dataclasses).
# ---------------------------------------------------------------------------


@dataclass
class PrefillItem:
    """Start a sequence: register its prompt and run it through the model.

    On the target this also samples the first generated token.
    """

    seq_id: str
    prompt_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    # feature-level drafts only: target features of the prompt's tokens (row t feeds prompt token t + 1)
    features: FeatureBlock | None = None
    # chunked prefill: compute at most this many prompt tokens in this call (tokens served by the prefix cache
    # are free); the rest follows in later calls with ``resume``. 0 = the whole prompt now
    max_tokens: int = 0
    resume: bool = False  # continue the chunked prefill of a live sequence (``prompt_ids`` is not read)
    cache_salt: str = ""  # prefix-cache tenant: sequences of different salts never share KV blocks
    # how many of prompt_ids are the request's prompt (the rest: output of a request prefilled again); None: all
    num_prompt_tokens: int | None = None
    grammar: GrammarSpec | None = None  # structured output: every token after grammar.start is constrained


@dataclass
class VerifyItem:
    """Verify one sequence's speculative tree on the target (an empty tree is a plain decode step).

    Draft relay (services/target/draft_relay.py): ``relay`` RELAY_TAKE verifies the tree the draft relayed for
    the sequence instead of ``tree`` (empty), RELAY_DROP drops it for a plain decode step; ``handoff`` asks
    the target to hand the draft this step's committed tokens after the step (its ``new_tokens``: those the
    draft lacks before them) to draft its shape next, capped to ``remaining`` (what the sequence may still
    emit before this step) - 1.
    """

    seq_id: str
    tree: TokenTree = field(default_factory=TokenTree)
    relay: int = 0
    handoff: SpecItem | None = None
    remaining: int = 0
    relay_cut: int = 0  # with RELAY_TAKE: a relayed chain is cut to this many nodes (0: whole)
    # step streams (services/target/repeat_plan.py), the same on every item of a call: ``repeat`` continuation
    # steps the target runs by itself after this plan; ``continued``: this call is such a step (its outcome is read),
    # and with ``repeat`` N it first asks for N more after the last one owed (TargetPlan.goes_on)
    repeat: int = 0
    continued: bool = False


RELAY_TAKE, RELAY_DROP = 1, 2
# RelayHandoff.lookahead_flags (services/draft/relay_lookahead.py): also draft a lookahead; the last one was taken
LOOKAHEAD, LOOKAHEAD_TAKEN = 1, 2


@dataclass
class SpecItem:
    """Ask the draft for speculation on one sequence.

    ``new_tokens`` are the tokens committed since the last call for this
    sequence (accepted path + bonus), so the draft's KV cache follows the
    target. Exactly one shape: a chain of ``chain_len`` tokens (optionally
    stopped early when the draft's confidence drops below
    ``confidence_threshold``, SmartSpec App. A), or a beam-search candidate
    tree of ``tree_depth`` x ``tree_width`` (AdaServe §4.3 step 1).
    """

    seq_id: str
    new_tokens: list[int] = field(default_factory=list)
    chain_len: int = 0
    tree_depth: int = 0
    tree_width: int = 0
    confidence_threshold: float = 0.0
    # a tree drafted by per-node top-k expansion (SpecInfer) instead of a beam: expansion[d] children of every
    # node at depth d; len = tree_depth, and tree_width = the most nodes one level holds
    tree_expansion: tuple[int, ...] = ()
    rollback: int = 0  # committed tokens to drop before appending new_tokens (an optimistic prefix that failed)
    # feature-level drafts only: target features the scheduler received since the last call (positions tagged)
    features: FeatureBlock | None = None


@dataclass
class PrefillResult:
    seq_id: str
    first_token: int  # -1 while ``pending``
    features: FeatureBlock | None = None  # the features of the prompt tokens this call ran, when asked for
    pending: bool = False  # a chunk of a longer prompt: nothing sampled yet, resume it
    num_prefilled: int = 0  # prompt tokens in the KV cache after this call
    num_cached: int = 0  # of them, served by the prefix cache in this call
    logprobs: TokenLogprobs | None = None  # of first_token, when the sampling asks for them
    # prompt tokens 1 .. num_prompt_tokens - 1 under the model (temperature 1, no penalties), when asked for
    prompt_logprobs: list[TokenLogprobs] | None = None


@dataclass
class StepCost:
    """Timing of one service call, for the profiler and the policies."""

    forward: list[ForwardCost] = field(default_factory=list)
    total_s: float = 0.0
