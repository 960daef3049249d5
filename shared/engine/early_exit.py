"""Token-wise early exit in verification (FASER §4.2, eq. 5-10): which tree nodes stop before the last layer.

From layer ``L_init`` on, the runner may turn the hidden state of each row that
is the parent of a live tree node into intermediate logits (final norm + LM
head) and prune every node whose token is outside the top-``K_l`` of its
parent's logits, together with its subtree; only the remaining rows run the
deeper layers::

    layer   0 .. L_init-1   L_init          L_init+1 ...        L-1
    rows    root n0 n1 n2   check: n1 out   root n0 n2 (n1 and its children gone)

Why it stays lossless: pruning only removes a node's *own* row, i.e. the
target's logits for that node's children. The node's acceptance test needs
its parent's row, which always runs every layer. ``accept_tree`` therefore
still tests a pruned node exactly; it just cannot descend into it, so a pruned
node the test would accept ends the walk as the bonus token (greedy: the
argmax at the parent, which is that very token). The emitted tokens are a
prefix of what the unpruned walk would emit, drawn from the same distribution;
a pruned node is reported as rejected. A wrong prune costs acceptance length,
never correctness.

When to prune (eq. 5-10), per forward, before each check layer ``l``::

    k_rej   = sum_i s_i * (1 - a_i)                     eq. 5-6 (a_i: request's acceptance estimate)
    dL_ee   = L * T_ee / T_t                            eq. 7   (checker cost in layers)
    L_r'    = max(L - l - 1 - dL_ee, 0)                 eq. 8   (layers l+1..L-1 remain)
    T_save  = L_r' / L * T_t(k_rej)                     eq. 9
    prune iff T_save - T_loss > T_pr (+ T_ee when the check runs on the critical path)   eq. 10
    T_loss  = k_rej * w_l * l(a, m) * t_tok             (an extension: acceptance a wrong prune costs)

``T_t(k_rej)`` in eq. 9 is what the k_rej rows add to a verify: the *marginal*
per-token cost (the slope of T(n)), not a forward's time divided by its tokens.
The two differ by the per-forward fixed cost (weights, launches, host work): at
batch 1 a 5-token verify on 2 CPU cores costs ~54 ms of which ~40 ms a 1-token
decode costs too, and on a host-bound GPU T(n) is flat (H200, 2026-11-27:
T(1) 24.7 ms, T(256) 37.7 ms), so there pruning saves nothing while the average
said 5 ms per token (the 2026-11-28 H200 run: early exit +32 % TPOT). The slope
comes, first match wins, from the target's profile (``gamma``, seconds per batched
token through all layers, given as ``token_cost_s``), from a least-squares line
through this controller's own forwards once their sizes vary enough, or from the
average per token-layer (an upper bound) until then. ``T_ee`` is the measured cost
of one check, ``T_pr`` the measured cost of dropping rows (re-planning attention,
gathering rows). The
paper runs the checker on a side CUDA stream, so only eq. 7 charges it; on
CPU (and in this implementation generally) the check runs inline, so its cost
is charged in full as well (``inline_check``).

``T_loss`` is beyond the paper, whose eq. 10 counts only time: a pruned node
the target would have accepted ends its walk there, so the request loses the
accepted tokens below it and the bonus after them, ``l(a, m) = 1 + a + ... +
a^m`` on average (``m`` the depth of the drafted chain below the node, ``a`` the
batch's acceptance), each worth ``t_tok``, this target's measured forward time
per emitted token. ``w_l`` is the share of nodes flagged at layer ``l`` that
the acceptance test would pass, measured per layer (a wide ``K`` at a shallow
layer cuts more good tokens than a narrow one deep down). After a prune, the
rows it removed leave ``k_rej`` and the forward, so a later layer's check
prices only what is left: before, every check layer saw the same ``k_rej`` and
a 40-row batch ran five checks a forward (2026-11-29, +24 % TPOT at 8x load).

Measuring never prunes: a *shadow* check runs the test and flags the nodes it
would prune but keeps them, so the acceptance walk says whether they would
have passed, at no acceptance cost. Shadow checks time the check (a size never
timed, one every ``explore_every`` steps) and measure ``w_l`` (every
``explore_every`` steps, rotating over the check layers).

``K_l`` is depth dependent: conservative (``k_init``) at ``L_init``, stricter
(``k_final``) at the last layer, linear in between.

Whether the check has a signal at all is measured, not assumed (beyond the
paper, which exits from layers trained for it). A pruned node whose parent the
walk reached is still tested (above), so the controller sees how often pruned
nodes would have passed against how often kept nodes pass. Where pruning does
not pick out likely rejections (pass rate of pruned >= ``signal_ratio`` x that
of kept, over ``signal_min`` reached pruned nodes) the gate closes, except on
every ``explore_every``-th verify, which keeps measuring. SmolLM2's middle
layers carry no such signal: on an H200 early exit pruned 88 % of the drafted
tokens and TPOT rose 32 % (2026-11-28). The acceptance estimates a_i of eq. 6
count a pruned node that passed as accepted: otherwise every wrong prune lowers
a_i, raises k_rej and prunes more.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import BaseModel, Field


SKIP, PRUNE, SHADOW = "skip", "prune", "shadow"  # what a check layer does (EarlyExitController.decide)


class EarlyExitConfig(BaseModel):
    """Settings of token-wise early exit; disabled by default."""

    enabled: bool = Field(False, description="Prune drafted tree nodes from intermediate layers (FASER §4.2).")
    init_layer: float = Field(
        0.5, ge=0.0, description="L_init: first layer checked; < 1 is a fraction of the model's layers, >= 1 a layer index."
    )
    check_every: int = Field(1, ge=1, description="Check every this many layers from L_init on.")
    k_init: int = Field(32, ge=1, description="K_l at L_init (conservative: a token must fall outside a wide top-K).")
    k_final: int = Field(8, ge=1, description="K_l at the last layer; interpolated linearly in between.")
    gate: bool = Field(
        True, description="Prune only when eq. 10 predicts a saving (T_save > T_pr); False always checks (tests, ablation)."
    )
    inline_check: bool = Field(True, description="The check runs on the critical path: charge T_ee in full in eq. 10.")
    prior_accept: float = Field(0.5, ge=0.0, le=1.0, description="Acceptance estimate a_i of a request not seen yet.")
    ema: float = Field(0.2, gt=0.0, le=1.0, description="Weight of a new sample in the running cost and acceptance estimates.")
    signal_ratio: float = Field(
        0.5, gt=0.0,
        description="Close the gate while pruned nodes pass at least this share as often as kept ones (no exit signal).",
    )  # fmt: skip
    signal_min: int = Field(20, ge=1, description="Reached pruned nodes needed before the signal is judged.")
    explore_every: int = Field(20, ge=1, description="With the gate closed for want of signal, still check every n-th verify.")
    lens: str = Field(
        "auto",
        description="Intermediate logits through a tuned lens (tuned_lens.py): auto = the target directory's "
        "tuned_lens.safetensors when there is one, off = the plain logit lens, else a directory holding one. "
        "With a lens, only the layers it has a translator for are checked.",
    )  # fmt: skip
    token_cost_s: float | None = Field(
        None, ge=0.0,
        description="Marginal seconds per verified token through all layers (the profile's gamma); None: fitted online.",
    )  # fmt: skip


def init_layer(config: EarlyExitConfig, num_layers: int) -> int:
    l_init = config.init_layer * num_layers if config.init_layer < 1 else config.init_layer
    return max(0, min(num_layers - 1, int(l_init)))


def k_at(config: EarlyExitConfig, layer: int, num_layers: int) -> int:
    """K_l: ``k_init`` at L_init down (or up) to ``k_final`` at the last layer."""
    start = init_layer(config, num_layers)
    span = max(1, num_layers - 1 - start)
    frac = min(1.0, max(0.0, (layer - start) / span))
    return max(1, round(config.k_init + frac * (config.k_final - config.k_init)))


def check_layers(config: EarlyExitConfig, num_layers: int) -> list[int]:
    """Layers after which a check may run (the last layer is never one: nothing is left to save)."""
    return list(range(init_layer(config, num_layers), num_layers - 1, config.check_every))


def expected_rejected(num_drafted: list[int], accept_rates: list[float]) -> float:
    """eq. 5-6: k_rej = sum_i s_i * (1 - a_i)."""
    return sum(s * (1.0 - a) for s, a in zip(num_drafted, accept_rates))


def time_saved(layer: int, num_layers: int, t_token_layer: float, num_tokens: int, k_rej: float, t_ee: float,
               marginal_token_layer: float | None = None) -> float:  # fmt: skip
    """eq. 7-9: verify time of the k_rej likely-rejected tokens over the layers still left after ``layer``.

    ``t_token_layer`` is a forward's time over its token-layers, so the forward costs
    T_t = n * L * t_token_layer (eq. 7's T_t, ``num_tokens`` = n); ``marginal_token_layer`` is what one
    more token adds per layer (eq. 9's T_t(k_rej) = k_rej * L * it; default: the average).
    """
    marginal = t_token_layer if marginal_token_layer is None else marginal_token_layer
    t_verify = max(1, num_tokens) * num_layers * t_token_layer
    dl_ee = num_layers * t_ee / t_verify if t_verify > 0 else float(num_layers)  # eq. 7
    remaining = max(num_layers - layer - 1 - dl_ee, 0.0)  # eq. 8
    return remaining / num_layers * (k_rej * num_layers * marginal)  # eq. 9


@dataclass
class MarginalCost:
    """Exponentially weighted least-squares line seconds = c0 + c1 * token_layers through the forwards seen.

    ``slope()`` is c1, the marginal seconds per token-layer, once the forwards' sizes vary enough to tell it
    from the fixed cost c0 (coefficient of variation of token_layers >= ``min_spread``); clipped to
    [0, the average per token-layer], the average being the slope of a line through the origin. The last
    slope fitted is kept while later forwards are all of one size (a closed gate stops the pruning that
    made them differ; the slope is the hardware's and does not change with it)."""

    weight: float = 0.2
    min_spread: float = 0.1
    n: float = 0.0
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0
    last: float | None = None
    max_x: float = 0.0

    def add(self, x: float, y: float) -> None:
        self.max_x = max(self.max_x, x)
        keep = 1.0 - self.weight
        self.n = keep * self.n + 1.0
        self.sx = keep * self.sx + x
        self.sy = keep * self.sy + y
        self.sxx = keep * self.sxx + x * x
        self.sxy = keep * self.sxy + x * y

    def slope(self) -> float | None:
        if self.n <= 0.0 or self.sx <= 0.0:
            return None
        mx, my = self.sx / self.n, self.sy / self.n
        var = self.sxx / self.n - mx * mx
        if var < (self.min_spread * mx) ** 2:
            return self.last  # every forward about as big: the slope cannot be told from the fixed cost
        c1 = (self.sxy / self.n - mx * my) / var
        self.last = min(max(c1, 0.0), my / mx)
        return self.last

    def predict(self, x: float, reach: float = 1.5) -> float | None:
        """Seconds at size ``x`` from the line (c0 = mean y - c1 * mean x, c1 = ``slope()``); None when ``x`` lies
        beyond ``reach`` times the largest size seen (measure it: a line through small sizes does not reach it).

        Without spread the cost is taken proportional to size (an upper bound where a fixed cost dominates)."""
        if self.n <= 0.0 or self.sx <= 0.0:
            return None
        mx, my = self.sx / self.n, self.sy / self.n
        if x > reach * self.max_x:
            return None
        c1 = self.slope()
        if c1 is None:
            return my / mx * x
        return max(0.0, my - c1 * mx) + c1 * x


@dataclass
class PruneOutcome:
    """What one verify's acceptance walk says about its prunes: nodes whose parent the walk reached, pruned or
    kept, and how many of each passed the acceptance test."""

    pruned_reached: int = 0
    pruned_passed: int = 0
    kept_reached: int = 0
    kept_passed: int = 0


def prune_outcome(parent_ids: list[int], token_ids: list[int], accepted_nodes: list[int], bonus: int,
                  pruned: list[int], shadow: list[int] = ()) -> PruneOutcome:  # fmt: skip
    """Reached = the parent is the root or on the accepted path. A kept node passed when it is on the path; a
    pruned one when the walk ended at its parent with the bonus equal to its token (it passed, but could not
    be descended into; exact when greedy, the target's draw there when sampling). ``shadow``: nodes a shadow
    check flagged but kept; they count with the pruned (they are what pruning would remove), passed when on
    the path."""
    on_path = set(accepted_nodes)
    end = accepted_nodes[-1] if accepted_nodes else -1
    stopped, flagged = set(pruned), set(shadow)
    out = PruneOutcome()
    for node, (parent, token) in enumerate(zip(parent_ids, token_ids)):
        if parent != -1 and parent not in on_path:
            continue
        if node in stopped:
            out.pruned_reached += 1
            out.pruned_passed += int(parent == end and token == bonus)
        elif node in flagged:
            out.pruned_reached += 1
            out.pruned_passed += int(node in on_path)
        else:
            out.kept_reached += 1
            out.kept_passed += int(node in on_path)
    return out


def layer_outcomes(parent_ids: list[int], token_ids: list[int], accepted_nodes: list[int], bonus: int,
                   flags: list[tuple[int, int, bool]]) -> dict[int, PruneOutcome]:  # fmt: skip
    """Per check layer, the reached and passed nodes it flagged: ``flags`` = (node, layer, pruned) for every
    node a check at ``layer`` put outside its top-K (pruned, or kept by a shadow check); rules as above."""
    on_path = set(accepted_nodes)
    end = accepted_nodes[-1] if accepted_nodes else -1
    out: dict[int, PruneOutcome] = {}
    for node, layer, was_pruned in flags:
        parent = parent_ids[node]
        if parent != -1 and parent not in on_path:
            continue
        o = out.setdefault(layer, PruneOutcome())
        o.pruned_reached += 1
        o.pruned_passed += int(parent == end and token_ids[node] == bonus) if was_pruned else int(node in on_path)
    return out


@dataclass
class EarlyExitStats:
    """Running estimates the gate needs: measured costs and per-request acceptance."""

    t_token_layer: float = 0.0  # s per token per layer: a forward's time over its token-layers (the average)
    t_check: float = 0.0  # s per check (norm + LM head + top-K count), per parent row (reports)
    check_line: MarginalCost = field(default_factory=MarginalCost)  # a check's time against its parent rows (eq. 13)
    t_prune: float = 0.0  # s per prune (row gather + attention re-plan)
    accept: dict[str, float] = field(default_factory=dict)  # seq id -> acceptance rate estimate
    line: MarginalCost = field(default_factory=MarginalCost)  # the forwards' time against their token-layers
    prunes: PruneOutcome = field(default_factory=PruneOutcome)  # decayed sums over the verifies seen
    by_layer: dict[int, PruneOutcome] = field(default_factory=dict)  # the same per check layer (flagged nodes)
    t_emitted: float = 0.0  # s of forward per token the forward emitted (T_loss's t_tok)
    verifies: int = 0

    def has_signal(self, config: EarlyExitConfig) -> bool | None:
        """Do pruned nodes pass clearly less often than kept ones? None until ``signal_min`` were reached."""
        p = self.prunes
        if p.pruned_reached < config.signal_min or p.kept_reached <= 0:
            return None
        return p.pruned_passed / p.pruned_reached < config.signal_ratio * (p.kept_passed / p.kept_reached)

    @staticmethod
    def _mix(old: float, new: float, w: float) -> float:
        return new if old <= 0.0 else (1 - w) * old + w * new


class EarlyExitController:
    """Decides, per forward and check layer, whether to check and prune (the runner does the tensor work)."""

    def __init__(self, config: EarlyExitConfig, num_layers: int, lens_layers: list[int] | None = None):
        self.config = config
        self.num_layers = num_layers
        self.layers = set(check_layers(config, num_layers))
        if lens_layers is not None:  # a tuned lens reads only the layers it was trained for
            self.layers &= set(lens_layers)
        self.first_layer = min(self.layers, default=-1)  # where the cost line is re-timed
        self._order = sorted(self.layers)
        self.stats = EarlyExitStats(line=MarginalCost(weight=config.ema))
        self.num_checks = 0  # checks run in the last forward, for reports
        self._k_rej = 0.0
        self._num_tokens = 0
        self._steps = 0  # verify steps begun
        self._accept = config.prior_accept  # the batch's acceptance estimate (drafted-weighted a_i)
        self._forward_s = 0.0  # the last forward's time, and the tokens its verifies emitted
        self._emitted = 0

    def k_at(self, layer: int) -> int:
        return k_at(self.config, layer, self.num_layers)

    def marginal_token_layer(self) -> tuple[float, str]:
        """eq. 9's per-token cost per layer, and where it came from: "profile", "fitted" or "average"."""
        if self.config.token_cost_s is not None:
            return self.config.token_cost_s / max(1, self.num_layers), "profile"
        fitted = self.stats.line.slope()
        if fitted is not None:
            return fitted, "fitted"
        return self.stats.t_token_layer, "average"

    def begin(self, seq_ids: list[str], num_drafted: list[int]) -> float:
        """Start a verify step; returns k_rej (eq. 6) for its requests."""
        self._fold_step()
        self.num_checks = 0
        self._steps += 1
        rates = [self.stats.accept.get(s, self.config.prior_accept) for s in seq_ids]
        self._k_rej = expected_rejected(num_drafted, rates)
        drafted = sum(num_drafted)
        self._accept = sum(s * a for s, a in zip(num_drafted, rates)) / drafted if drafted else self.config.prior_accept
        return self._k_rej

    def _fold_step(self) -> None:
        """The last step's forward time over the tokens it emitted enters t_tok."""
        if self._forward_s > 0.0 and self._emitted > 0:
            s = self.stats
            s.t_emitted = EarlyExitStats._mix(s.t_emitted, self._forward_s / self._emitted, self.config.ema)
        self._forward_s, self._emitted = 0.0, 0

    def begin_forward(self, num_tokens: int) -> None:
        """The runner's forward starts with ``num_tokens`` rows (eq. 7's batch)."""
        self._num_tokens = num_tokens

    def should_check(self, layer: int, num_parent_rows: int, live: int | None = None, depth_below: float = 0.0) -> bool:
        """Does a check run at this layer (pruning or shadow)? See ``decide``."""
        return self.decide(layer, num_parent_rows, live, depth_below) != SKIP

    def decide(self, layer: int, num_parent_rows: int, live: int | None = None, depth_below: float = 0.0) -> str:
        """eq. 10 for this layer: SKIP, PRUNE (check and prune), or SHADOW (check, flag, keep: measuring).

        ``live``: drafted nodes still running (k_rej cannot exceed them); ``depth_below``: the mean drafted
        depth below a live node (T_loss's m)."""
        if layer not in self.layers or num_parent_rows == 0:
            return SKIP
        if not self.config.gate:
            return PRUNE
        s = self.stats
        if s.t_token_layer <= 0.0:
            return SHADOW  # nothing measured yet: check once so the costs get measured
        t_ee = s.check_line.predict(num_parent_rows)
        if t_ee is None:
            return SHADOW  # a check of this many rows was never timed: a batch-1 check's per-row cost (its LM-head
            # read, memory-bound) says nothing of 60 rows (compute-bound); measure once
        if self._steps % self.config.explore_every == 0 and layer == self._explore_layer():
            return SHADOW  # keep the check's line and this layer's w_l current, rotating over the layers
        if s.has_signal(self.config) is False:
            return SKIP  # pruning does not pick out rejections here: it would only cost acceptance
        k_rej = self._k_rej if live is None else min(self._k_rej, float(live))
        saved = time_saved(layer, self.num_layers, s.t_token_layer, self._num_tokens, k_rej, t_ee,
                           marginal_token_layer=self.marginal_token_layer()[0])  # fmt: skip
        cost = s.t_prune + (t_ee if self.config.inline_check else 0.0)
        return PRUNE if saved - self.time_lost(layer, k_rej, depth_below) > cost else SKIP

    def _explore_layer(self) -> int:
        return self._order[(self._steps // self.config.explore_every) % len(self._order)] if self._order else -1

    def wrong_rate(self, layer: int, weight: float = 5.0) -> float:
        """w_l: the share of nodes flagged at ``layer`` that would pass, smoothed toward all layers' share
        (``weight`` pseudo-observations; before any flagged node, the kept nodes' pass rate: no signal assumed)."""
        p = self.stats.prunes
        if p.pruned_reached > 0:
            prior = p.pruned_passed / p.pruned_reached
        elif p.kept_reached > 0:
            prior = p.kept_passed / p.kept_reached
        else:
            prior = self.config.prior_accept
        o = self.stats.by_layer.get(layer)
        reached, passed = (o.pruned_reached, o.pruned_passed) if o is not None else (0.0, 0.0)
        return (passed + weight * prior) / (reached + weight)

    def time_lost(self, layer: int, k_rej: float, depth_below: float) -> float:
        """T_loss: k_rej prunes, a share w_l of them wrong, each losing l(a, m) tokens worth t_tok each."""
        a = min(self._accept, 0.99)
        tail = (1.0 - a ** (depth_below + 1.0)) / (1.0 - a)  # 1 + a + ... + a^m
        return k_rej * self.wrong_rate(layer) * tail * self.stats.t_emitted

    def observe_check(self, seconds: float, num_parent_rows: int) -> None:
        self.num_checks += 1
        self.stats.check_line.add(num_parent_rows, seconds)
        self.stats.t_check = EarlyExitStats._mix(self.stats.t_check, seconds / max(1, num_parent_rows), self.config.ema)

    def observe_prune(self, seconds: float, rows: int = 0) -> None:
        """A prune took ``seconds`` and removed ``rows`` rows: they leave k_rej and the forward (eq. 6-7)."""
        self.stats.t_prune = EarlyExitStats._mix(self.stats.t_prune, seconds, self.config.ema)
        self._k_rej = max(0.0, self._k_rej - rows)
        self._num_tokens = max(1, self._num_tokens - rows)

    def observe_forward(self, seconds: float, token_layers: int) -> None:
        """A forward's layer time over the token-layers it ran (pruned rows ran fewer layers)."""
        self._forward_s += seconds
        if token_layers > 0:
            self.stats.t_token_layer = EarlyExitStats._mix(self.stats.t_token_layer, seconds / token_layers, self.config.ema)
            self.stats.line.add(token_layers, seconds)

    def observe_outcome(self, outcome: PruneOutcome, by_layer: dict[int, PruneOutcome] | None = None) -> None:
        """One verify's acceptance walk (``prune_outcome``, ``layer_outcomes``); older verifies weigh less."""
        keep = 1.0 - self.config.ema / 4  # a slower memory than the costs': passes are rare events
        self.stats.verifies += 1
        for p, new in [(self.stats.prunes, outcome)] + [
            (self.stats.by_layer.setdefault(layer, PruneOutcome()), o) for layer, o in (by_layer or {}).items()
        ]:
            p.pruned_reached = keep * p.pruned_reached + new.pruned_reached
            p.pruned_passed = keep * p.pruned_passed + new.pruned_passed
            p.kept_reached = keep * p.kept_reached + new.kept_reached
            p.kept_passed = keep * p.kept_passed + new.kept_passed
        for layer, p in self.stats.by_layer.items():
            if layer not in (by_layer or {}):
                p.pruned_reached *= keep
                p.pruned_passed *= keep

    def observe_accept(self, seq_id: str, num_drafted: int, num_accepted: int, pruned_passed: int = 0) -> None:
        """``pruned_passed``: a pruned node passed its test; it counts as accepted (eq. 6's a_i is the test's)."""
        if num_drafted <= 0:
            return
        self._emitted += num_accepted + 1
        rate = min(1.0, (num_accepted + pruned_passed) / num_drafted)
        old = self.stats.accept.get(seq_id)
        self.stats.accept[seq_id] = rate if old is None else (1 - self.config.ema) * old + self.config.ema * rate

    def describe(self) -> str:
        """One line of the gate's state, for the target's log."""
        s, p = self.stats, self.stats.prunes
        marginal, source = self.marginal_token_layer()
        line = s.check_line
        wrong = " ".join(f"{layer}:{self.wrong_rate(layer):.2f}" for layer in self._order)
        check = "untimed" if line.n <= 0 else f"{line.sy / line.n * 1e3:.2f} ms at {line.sx / line.n:.0f} rows"
        return (f"early exit: {s.verifies} verifies, signal {s.has_signal(self.config)} (pruned passed "
                f"{p.pruned_passed:.1f}/{p.pruned_reached:.1f}, kept {p.kept_passed:.1f}/{p.kept_reached:.1f}), "
                f"marginal {marginal * 1e6:.1f} us/token-layer ({source}), check {check}, prune {s.t_prune * 1e3:.2f} ms, "
                f"k_rej {self._k_rej:.1f}, {self.num_checks} checks in the last forward, t_tok {s.t_emitted * 1e3:.1f} ms, "
                f"w_l {wrong}")  # fmt: skip

    def forget(self, seq_id: str) -> None:
        self.stats.accept.pop(seq_id, None)
