"""Policies by name, as the scheduler's configuration spells them (TANDEM_SPECULATION_POLICY, ...).

The speculation policy decides for requests in mode AUTO; requests that ask
for OFF or FIXED k override it per request (scheduler.policies.speculation).

    speculation   fixed, fixed:K   every AUTO request drafts a chain of K (4)   FixedChain(K)
                  none, off        plain decoding unless a request asks         NoSpeculation
                  adaserve[:OPTS]  SLO-customized trees under the budget B      AdaServe; OPTS joined by +:
                                   marginal (a node only while it raises expected goodput),
                                   depth (with marginal: draft a level only while it pays),
                                   paced (none that pushes a request below its SLO),
                                   triage (requests past saving get no SLO-customized nodes)
                  global_greedy[:marginal[+depth]]  most probable nodes under B, no SLOs  GlobalGreedy
                  equal_greedy     B split evenly, greedy per request           EqualGreedy
                  specinfer[:E]    fixed tree, expansion E (1-1-3-1-1-1-1-1)    SpecInferTree(E)
                  smartspec[:K]    goodput-optimal k for the batch, k <= K (8)  SmartSpec (granularity batch)
                  smartspec-request[:K]  ... a k per request (alpha per request) SmartSpec (granularity request)
                  smartspec-depth[:K]    ... one k, an alpha per draft depth        SmartSpec (per_depth)
                  smartspec-nofeed[:K]   ... T(k) without the draft feed (ablation) SmartSpec (charge_feed off)
                  smartspec-noswitch[:K] ... without the switch's catch-up (ablation) SmartSpec (charge_switch off)
                  smartspec-reqcost[:K]  ... the step cost with a per-request term (extension)
                  smartspec-request-noswitch[:K]  the same, a k per request
                  smartspec-prefix[:K]   ... each step the FCFS prefix of the running requests of best goodput
                                         (Algorithm 2 lines 2-11)              SmartSpec (batch_search)
                  smartspec-request-prefix[:K]  the same, a k per request
                  smartspec-conf[:T]     draft until confidence < T (0.5),     SmartSpecConfidence
                                         verify the goodput-optimal prefix
                  faser[:K]        per-request k by GP-LCB, k <= K (8)          Faser
                  faser-fixedgp[:K]  the same, the GP's signal sd fixed at 30 %  Faser (signal fixed)
                                   of a step (the ablation of the empirical one)
                  faser-joint[:K]  the batch's lengths chosen together: eq. 1   Faser (joint)
                                   for the batch at its mixed lengths (per max
                                   depth), the GP's LCB correcting each
                  faser-joint-switch[:K]  the same, a resumed request charged  Faser (joint, charge_switch)
                                   the draft's catch-up (as SmartSpec)
                  faser-joint-recent[:K]  joint, each request's acceptance  Faser (joint, request_decay 0.9)
                                   from its recent steps (weight 0.9 per step)
                  nightjar[:K]     bandit k per batch size, k <= K (8),          Nightjar
                                   switching cost (ADA-BINGREEDY, eq. 3); with
                                   TANDEM_DRAFT_OFFLOAD the draft's memory is
                                   elastic (scheduler.policies.elastic_memory)
                  nightjar-global[:K]  the same, exploration coin 1/√b with b   Nightjar (exploration global)
                                   counted over all bins (Lemma 2), not reset
                                   each block as Alg. 1 prints it
                  nightjar-chain[:K]   the same as nightjar, each arm's goodput     Nightjar (estimate chain)
                                   estimated as expected chain length (acceptance
                                   per depth pooled over all plays) over its time
                  nightjar-elim[:K]    the same as nightjar, exploration draws    Nightjar (eliminate 2.0)
                                   only among arms not eliminated (successive
                                   elimination, bounds mean ± 2 standard errors)
                  nightjar-lean[:K]    the three extensions together: Lemma 2's    Nightjar (exploration global,
                                   schedule, elimination and the chain estimate  estimate chain, eliminate 2.0)
                  nightjar-lean-pooled[:K]  the same, the chain estimate's time    Nightjar (... chain_time pooled)
                                   per arm a line a + b·γ fitted to every play,
                                   each play held within 0.5-2x its arm's mean
                  nightjar-lean-drift[:K]  lean, each arm's time relative to  Nightjar (... drift)
                                   the machine's speed tracked over all plays
                  nightjar-lean-bounds[:K]  lean-drift, elimination on the  Nightjar (... drift, eliminate_on
                                   chain estimate's own error bounds         estimate)
                  nightjar-lean-weighted[:K]  lean-bounds, the exploration draw  Nightjar (... eliminate_on
                                   weighted by each arm's chance to beat the  estimate, draw weighted)
                                   leader
                  nightjar-lean-local[:K]  lean-drift, exploration only among  Nightjar (... drift, neighbors 2)
                                   the arms within 2 of the leader (unimodal)
                  nightjar-lean-local-exact[:K]  the same in buckets 1-4 only  Nightjar (... neighbors_up_to 4)
    queue         fcfs             first come first served, priority first      FCFS
                  las[:Q]          least attained service, preemptive, quantum   LAS(Q s, 0.5)
                  lp-sjf           shortest predicted output first, no preemption LPSJF
                  laps-sd[:OPTS]   LAPS-SD (also laps_sd); OPTS k=4,m=2,s1=48r,   LapsSD
                                   gamma=4,delta=0.05 (K queues, M, S_1 in
                                   rounds, or s without the r, γ, δ),
                                   est=0|1 (1: non-perceptible requests ranked
                                   by eq. 6 too, not FCFS; laps_sd.py), prior=16
                                   (est=1: drafted tokens of weight of the
                                   class's mean acceptance; 0 = own rate alone),
                                   share=0|1 (1: eq. 6's rounds at the request's
                                   share of a batched forward, T(b)/b)

Queue policies get the target's profiled cost model (and the draft's, when
profiled) for LAPS-SD's eq. 6.

"""

from __future__ import annotations

from collections.abc import Callable

from scheduler.policies.adaserve import AdaServe, EqualGreedy, GlobalGreedy, SpecInferTree, TreePolicyConfig
from scheduler.policies.faser import Faser, FaserConfig
from scheduler.policies.nightjar import Nightjar, NightjarConfig
from scheduler.policies.smartspec import SmartSpec, SmartSpecConfidence, SmartSpecConfig
from scheduler.policies.step_cost import StepCostConfig
from scheduler.policies.acceptance_stability import Stability
from scheduler.policies.laps_sd import LapsConfig, LapsSD
from scheduler.policies.order_baselines import LAS, LPSJF
from scheduler.policies.priority_queues import QueueLevels
from scheduler.policies.queue import FCFS, QueuePolicy
from scheduler.policies.remaining_time import SDCosts
from scheduler.policies.speculation import FixedChain, NoSpeculation, SpeculationPolicy

DEFAULT_K = 4

# name -> factory(argument after the colon, or None)
SPECULATION_POLICIES: dict[str, Callable[[str | None], SpeculationPolicy]] = {
    "fixed": lambda arg: FixedChain(_chain_length(arg)),
    "none": lambda arg: NoSpeculation(),
    "off": lambda arg: NoSpeculation(),
    "adaserve": lambda arg: AdaServe(_tree_config(arg)),
    "global_greedy": lambda arg: GlobalGreedy(_tree_config(arg, allowed=("marginal", "depth"))),
    "equal_greedy": lambda arg: EqualGreedy(),
    "specinfer": lambda arg: SpecInferTree(_expansion(arg)) if arg else SpecInferTree(),
    "smartspec": lambda arg: SmartSpec(SmartSpecConfig(max_k=_max_k(arg))),
    "smartspec-request": lambda arg: SmartSpec(SmartSpecConfig(max_k=_max_k(arg), granularity="request")),
    "smartspec-depth": lambda arg: SmartSpec(SmartSpecConfig(max_k=_max_k(arg), per_depth=True)),
    "smartspec-nofeed": lambda arg: SmartSpec(SmartSpecConfig(max_k=_max_k(arg), charge_feed=False)),
    "smartspec-reqcost": lambda arg: SmartSpec(
        SmartSpecConfig(max_k=_max_k(arg), cost=StepCostConfig(per_request=True))
    ),
    "smartspec-noswitch": lambda arg: SmartSpec(SmartSpecConfig(max_k=_max_k(arg), charge_switch=False)),
    "smartspec-request-noswitch": lambda arg: SmartSpec(
        SmartSpecConfig(max_k=_max_k(arg), granularity="request", charge_switch=False)
    ),
    "smartspec-prefix": lambda arg: SmartSpec(SmartSpecConfig(max_k=_max_k(arg), batch_search=True)),
    "smartspec-request-prefix": lambda arg: SmartSpec(
        SmartSpecConfig(max_k=_max_k(arg), granularity="request", batch_search=True)
    ),
    "smartspec-conf": lambda arg: SmartSpecConfidence(SmartSpecConfig(confidence_threshold=_threshold(arg))),
    "faser": lambda arg: Faser(FaserConfig(max_k=_max_k(arg))),
    "nightjar": lambda arg: Nightjar(NightjarConfig(max_k=_max_k(arg))),
    "nightjar-global": lambda arg: Nightjar(NightjarConfig(max_k=_max_k(arg), exploration="global")),
    "nightjar-chain": lambda arg: Nightjar(NightjarConfig(max_k=_max_k(arg), estimate="chain")),
    "faser-fixedgp": lambda arg: Faser(FaserConfig(max_k=_max_k(arg, default=8), signal="fixed")),
    "faser-joint": lambda arg: Faser(FaserConfig(max_k=_max_k(arg), joint=True)),
    "faser-joint-switch": lambda arg: Faser(FaserConfig(max_k=_max_k(arg), joint=True, charge_switch=True)),
    "faser-joint-recent": lambda arg: Faser(FaserConfig(max_k=_max_k(arg), joint=True, request_decay=0.9)),
    "nightjar-elim": lambda arg: Nightjar(NightjarConfig(max_k=_max_k(arg), eliminate=2.0)),
    "nightjar-lean": lambda arg: Nightjar(
        NightjarConfig(max_k=_max_k(arg), exploration="global", estimate="chain", eliminate=2.0)
    ),
    "nightjar-lean-pooled": lambda arg: Nightjar(
        NightjarConfig(max_k=_max_k(arg), exploration="global", estimate="chain", eliminate=2.0, chain_time="pooled")
    ),
    "nightjar-lean-drift": lambda arg: Nightjar(
        NightjarConfig(max_k=_max_k(arg), exploration="global", estimate="chain", eliminate=2.0, drift=True)
    ),
    "nightjar-lean-bounds": lambda arg: Nightjar(
        NightjarConfig(max_k=_max_k(arg), exploration="global", estimate="chain", eliminate=2.0, drift=True,
                       eliminate_on="estimate")
    ),
    "nightjar-lean-weighted": lambda arg: Nightjar(
        NightjarConfig(max_k=_max_k(arg), exploration="global", estimate="chain", eliminate=2.0, drift=True,
                       eliminate_on="estimate", draw="weighted")
    ),
    "nightjar-lean-local": lambda arg: Nightjar(
        NightjarConfig(max_k=_max_k(arg), exploration="global", estimate="chain", eliminate=2.0, drift=True,
                       neighbors=2)
    ),
    "nightjar-lean-local-exact": lambda arg: Nightjar(
        NightjarConfig(max_k=_max_k(arg), exploration="global", estimate="chain", eliminate=2.0, drift=True,
                       neighbors=2, neighbors_up_to=4)
    ),
}
# name -> factory(argument after the colon or None, eq. 6's costs)
QUEUE_POLICIES: dict[str, Callable[[str | None, SDCosts], QueuePolicy]] = {
    "fcfs": lambda arg, costs: FCFS(),
    "las": lambda arg, costs: LAS(_positive(arg, "las:Q quantum (s)")) if arg else LAS(),
    "lp-sjf": lambda arg, costs: LPSJF(),
    "laps-sd": lambda arg, costs: LapsSD(_laps_config(arg, costs)),
    "laps_sd": lambda arg, costs: LapsSD(_laps_config(arg, costs)),
}


def speculation_policy(spec: str) -> SpeculationPolicy:
    """The policy ``spec`` names: ``NAME`` or ``NAME:ARG`` (``fixed:3`` is a chain of 3)."""
    name, _, arg = spec.strip().lower().partition(":")
    factory = SPECULATION_POLICIES.get(name)
    if factory is None:
        raise ValueError(f"unknown speculation policy {spec!r}; available: {', '.join(SPECULATION_POLICIES)}")
    return factory(arg or None)


def _chain_length(arg: str | None) -> int:
    if arg is None:
        return DEFAULT_K
    if not arg.isdigit() or int(arg) < 1:
        raise ValueError(f"fixed:K needs a chain length K >= 1, got {arg!r}")
    return int(arg)


def _tree_config(
    arg: str | None, allowed: tuple[str, ...] = ("marginal", "depth", "paced", "triage")
) -> TreePolicyConfig:
    """``marginal`` (and with it ``depth``), and for AdaServe ``paced`` and ``triage``, joined by ``+``."""
    flags = set(arg.split("+")) if arg else set()
    if not flags <= set(allowed):
        raise ValueError(f"this tree policy takes no option or {', '.join(map(repr, allowed))} joined by '+', got {arg!r}")
    if "depth" in flags and "marginal" not in flags:
        raise ValueError(f"'depth' prices the drafting beside the marginal rule: write 'marginal+depth', got {arg!r}")
    return TreePolicyConfig(marginal_cost="marginal" in flags, price_depth="depth" in flags, paced="paced" in flags,
                            triage="triage" in flags)  # fmt: skip


def _max_k(arg: str | None, default: int = 8) -> int:
    if arg is None:
        return default
    if not arg.isdigit() or not 1 <= int(arg) <= 32:
        raise ValueError(f"the longest chain K must be an integer in 1..32, got {arg!r}")
    return int(arg)


def _threshold(arg: str | None) -> float:
    if arg is None:
        return 0.5
    try:
        value = float(arg)
    except ValueError:
        value = -1.0
    if not 0.0 < value <= 1.0:
        raise ValueError(f"smartspec-conf:T needs a confidence threshold T in (0, 1], got {arg!r}")
    return value


def _expansion(arg: str) -> tuple[int, ...]:
    parts = arg.split("-")
    if not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise ValueError(f"specinfer:E needs children per layer joined by '-', e.g. 1-1-3-1, got {arg!r}")
    return tuple(int(p) for p in parts)


def queue_policy(spec: str, *, cost_model=None, draft_cost_model=None) -> QueuePolicy:
    """The queue policy ``spec`` names (``NAME`` or ``NAME:ARG``); the cost models feed LAPS-SD's eq. 6."""
    name, _, arg = spec.strip().lower().partition(":")
    factory = QUEUE_POLICIES.get(name)
    if factory is None:
        raise ValueError(f"unknown queue policy {spec!r}; available: {', '.join(QUEUE_POLICIES)}")
    return factory(arg or None, SDCosts(target=cost_model, draft=draft_cost_model))


def _positive(text: str, what: str, *, zero_ok: bool = False) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (value >= 0 if zero_ok else value > 0):
        raise ValueError(f"{what} must be a number {'>=' if zero_ok else '>'} 0, got {text!r}")
    return value


_LAPS_OPTIONS = {"k": "num_queues", "m": "growth", "s1": "first_threshold", "gamma": "rounds", "delta": "tolerance",
                 "est": "unstable", "prior": "prior_tokens", "share": "share_rounds"}


def _laps_config(arg: str | None, costs: SDCosts) -> LapsConfig:
    """``k=4,m=2,s1=48r,gamma=4,delta=0.05,est=0,prior=16,share=0`` (any subset; ``+`` may join them too) -> LapsConfig.

    S_1: ``48r`` counts attained service in rounds (the default, Q1_ROUNDS: follows any machine), a plain
    number in seconds (the paper's E_i; priority_queues.py)."""
    values: dict[str, float] = {}
    unstable, unit = "fcfs", "rounds"
    for part in (arg or "").replace("+", ",").split(","):
        if not part.strip():
            continue
        key, eq, text = part.partition("=")
        if not eq or key.strip() not in _LAPS_OPTIONS:
            raise ValueError(f"laps-sd options are {', '.join(f'{k}=' for k in _LAPS_OPTIONS)}; got {part!r}")
        if key.strip() == "est":
            if text.strip() not in ("0", "1"):
                raise ValueError(f"laps-sd est is 0 (FCFS among non-perceptible requests, the paper) or 1 "
                                 f"(rank them by eq. 6 too); got {text!r}")  # fmt: skip
            unstable = "estimate" if text.strip() == "1" else "fcfs"
            continue
        if key.strip() == "share":
            if text.strip() not in ("0", "1"):
                raise ValueError(f"laps-sd share is 0 (a round at the request's own cost, eq. 6) or 1 (at its share "
                                 f"of a batched forward); got {text!r}")  # fmt: skip
            values["share_rounds"] = text.strip() == "1"
            continue
        if key.strip() == "prior":  # 0 is allowed: the request's own rate alone
            values["prior_tokens"] = _positive(text, "laps-sd prior (drafted tokens of weight)", zero_ok=True)
            continue
        if key.strip() == "s1":
            text = text.strip()
            unit = "rounds" if text.endswith("r") else "s"
            text = text.removesuffix("r")
        values[_LAPS_OPTIONS[key.strip()]] = _positive(text, f"laps-sd {key.strip()}")
    for field in ("num_queues", "rounds"):
        if field in values:
            if values[field] != int(values[field]):
                raise ValueError(f"laps-sd {field} must be an integer")
            values[field] = int(values[field])
    try:
        levels = QueueLevels(**{k: v for k, v in values.items() if k in ("num_queues", "growth", "first_threshold")},
                             unit=unit)
        stability = Stability(**{k: v for k, v in values.items() if k in ("rounds", "tolerance")})
    except ValueError as exc:
        raise ValueError(f"laps-sd: {exc}") from None
    extra = {k: values[k] for k in ("prior_tokens", "share_rounds") if k in values}
    return LapsConfig(levels=levels, stability=stability, costs=costs, unstable=unstable, **extra)
