"""The configurations a benchmark compares, by name.

    target-only       Tandem, speculation off for every request (plain decoding through the stack)
    tandem-k1/3/5     Tandem, a fixed draft chain of k per request ("tandem-k<K>" for any K)
    policy:<name>     Tandem with the scheduler's speculation policy <name> deciding (requests in AUTO);
                      e.g. policy:fixed:4. Each distinct policy needs a stack of its own.
    order:<queue>     Tandem, a fixed chain of 3 per request, on a stack whose scheduler orders requests
                      by the queue policy <queue> (fcfs, las, lp-sjf, laps-sd[:OPTS]); a stack each.
    draft:<draft>:k<K>   a chain of K per request from <draft> (a model name/path, ngram[:..], suffix[:..]); a stack each
    draft:<draft>@<policy>   requests in AUTO under the speculation policy <policy> (e.g. a fixed tree,
                      specinfer:1-2-1-1) with <draft>; a stack each
    faser:<variant>   FASER's ablation (§6): a fixed chain of 4 per request on a stack whose draft and
                      target split the machine (draft share 0.5: threads on CPU, MPS on CUDA) and whose
                      scheduler / target run with: serial (neither), pipe (TANDEM_FRONTIER=chunk=2; pipelined
                      where both modes measured say it pays, scheduler/frontier_gate.py),
                      ee (TANDEM_EARLY_EXIT=on), all (both); a stack each.
    offload:on|off[:<policy>]   Nightjar's elastic draft memory (§5.1): requests in AUTO under the speculation
                      policy <policy> (default smartspec, which stops drafting under load), on a stack whose
                      scheduler has TANDEM_DRAFT_OFFLOAD set to OFFLOAD_SPEC (on) or off; a stack each. The small
                      KV pool both share comes from the environment (bench.offload.pool_env).
    protocol:<p>:k<K>   a chain of K per request (k0: speculation off) on a stack whose scheduler talks to the
                      model services over TANDEM_WORKER_PROTOCOL=<p> (unary or stream); a stack each
    chunk:<N|off>:<config>   <config> (any Tandem configuration above) on a stack whose scheduler prefills long
                      prompts in chunks of N tokens inside the step's forward, or in one piece (off:
                      TANDEM_PREFILL_CHUNK=0); e.g. chunk:off:policy:adaserve; a stack each
    hf-target         HF transformers ``generate`` of the target alone, in the harness process
    hf-assisted       HF assisted generation (``assistant_model=draft``) with the library's default
                      schedule (transformers 5: 20 tokens, "constant", confidence threshold 0.4)
    hf-assisted-heuristic   the same with ``num_assistant_tokens_schedule="heuristic"``, starting at 5
                      (+2 after a fully accepted step, −1 otherwise: the transformers 4 default)

Tandem configurations that differ only in per-request speculation share one
stack (the mode travels with each request through the SDK); the HF ones run
batch 1 only, in this process, against the same models loaded from the same
directories.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Literal

DEFAULT_STACK_POLICY = "fixed:4"
ORDER_K = 3  # the chain each order:<queue> request drafts  # what AUTO requests get on the shared stack (none of the defaults send AUTO)


@dataclass(frozen=True)
class StackKey:
    """What makes two Tandem configurations need different service processes."""

    speculation_policy: str = DEFAULT_STACK_POLICY
    queue_policy: str = "fcfs"
    frontier: str | None = None  # the scheduler's TANDEM_FRONTIER; None = what the environment says
    early_exit: str | None = None  # the target's TANDEM_EARLY_EXIT; None = what the environment says
    draft_share: float | None = None  # the launcher's draft_share (FASER §4.4); None = no split
    draft_offload: str | None = None  # the scheduler's TANDEM_DRAFT_OFFLOAD; None = what the environment says
    draft_model: str | None = None  # this stack's draft (model name/path, ngram[:..], suffix[:..]); None = the pair's
    worker_protocol: str | None = None  # the scheduler's TANDEM_WORKER_PROTOCOL; None = what the environment says
    prefill_chunk: int | None = None  # the scheduler's TANDEM_PREFILL_CHUNK (0: one piece); None = the environment's


# FASER's ablation: chain length, frontier chunk (gated by the cost models when both are profiled,
# else always used), the draft's share of the machine, and what each variant switches on.
FASER_K = 4
FASER_FRONTIER = "chunk=2"
FASER_DRAFT_SHARE = 0.5
FASER_VARIANTS = {"serial": ("off", "off"), "pipe": (FASER_FRONTIER, "off"), "ee": ("off", "on"),
                  "all": (FASER_FRONTIER, "on")}  # fmt: skip


# Elastic draft memory (Nightjar §5.1): the policy that turns speculation off under load, and the trigger. The
# small pool holds only a few requests, so "scarce" is 25 % free rather than the paper's 10 %.
OFFLOAD_POLICY = "smartspec"
OFFLOAD_SPEC = "low=0.25,high=0.5,persist=4"


@dataclass(frozen=True)
class Config:
    name: str
    engine: Literal["tandem", "hf"]
    # tandem: "off" | "auto" | k (int); hf: "off" | "assisted" | "assisted-heuristic"
    speculation: str | int
    stack: StackKey | None = None
    hf_options: dict = field(default_factory=dict, hash=False, compare=False)

    @property
    def is_tandem(self) -> bool:
        return self.engine == "tandem"

    @property
    def speculates(self) -> bool:
        return self.speculation not in ("off", 0)


HF_ASSISTED_HEURISTIC = {"num_assistant_tokens": 5, "num_assistant_tokens_schedule": "heuristic"}

# The peers the serving benchmark compares against, measured at batch 1.
BATCH1_PEERS = ("target-only", "hf-target", "hf-assisted", "tandem-k1", "tandem-k3", "tandem-k5")
# Served under load (the HF peers cannot serve concurrent requests).
SWEEP_PEERS = ("target-only", "tandem-k1", "tandem-k3", "tandem-k5")


def parse(name: str, *, queue_policy: str = "fcfs") -> Config:
    """The configuration ``name`` stands for (see the module docstring); ValueError for unknown names."""
    stack = StackKey(queue_policy=queue_policy)
    if name.startswith("chunk:"):  # chunk:<N|off>:<config>: the same configuration, prefill chunked or in one piece
        _, size, inner = (name + "::").split(":", 2)
        inner = inner.rstrip(":")
        if not (size == "off" or size.isdigit() and int(size) > 0) or not inner:
            raise ValueError(f"{name}: use chunk:<N>:<config> (N tokens per chunk) or chunk:off:<config>")
        base = parse(inner, queue_policy=queue_policy)
        if not base.is_tandem or base.stack is None:
            raise ValueError(f"{name}: chunked prefill is a Tandem stack's setting, {inner!r} is not a Tandem configuration")
        key = dataclasses.replace(base.stack, prefill_chunk=0 if size == "off" else int(size))
        return dataclasses.replace(base, name=name, stack=key)
    if name == "target-only":
        return Config(name, "tandem", "off", stack)
    if m := re.fullmatch(r"tandem-k(\d+)", name):
        k = int(m.group(1))
        if k < 1:
            raise ValueError(f"{name}: k must be >= 1")
        return Config(name, "tandem", k, stack)
    if name.startswith("policy:") and len(name) > len("policy:"):
        return Config(name, "tandem", "auto", StackKey(name.removeprefix("policy:"), queue_policy))
    if name.startswith("order:") and len(name) > len("order:"):
        return Config(name, "tandem", ORDER_K, StackKey(DEFAULT_STACK_POLICY, name.removeprefix("order:")))
    if name.startswith("faser:"):
        variant = name.removeprefix("faser:")
        if variant not in FASER_VARIANTS:
            raise ValueError(f"{name}: the FASER variants are {', '.join(FASER_VARIANTS)}")
        frontier, early_exit = FASER_VARIANTS[variant]
        key = StackKey(DEFAULT_STACK_POLICY, queue_policy, frontier, early_exit, FASER_DRAFT_SHARE)
        return Config(name, "tandem", FASER_K, key)
    if name.startswith("offload:"):
        _, switch, policy = (name + ":").split(":")[:3]
        if switch not in ("on", "off"):
            raise ValueError(f"{name}: use offload:on or offload:off, optionally :<policy>")
        key = StackKey(policy or OFFLOAD_POLICY, queue_policy, draft_offload=OFFLOAD_SPEC if switch == "on" else "off")
        return Config(name, "tandem", "auto", key)
    if name.startswith("draft:") and "@" in name:  # draft:<draft>@<policy>: the stack's policy shapes (trees too)
        spec, _, policy = name.removeprefix("draft:").partition("@")
        if not spec or not policy:
            raise ValueError(f"{name}: use draft:<draft>@<policy>, e.g. draft:smollm2-eagle3@specinfer:1-2-1-1")
        return Config(name, "tandem", "auto", StackKey(policy, queue_policy, draft_model=spec))
    if name.startswith("draft:"):  # draft:<model or ngram/suffix spec>:k<K>  (bench-drafts: drafts side by side)
        spec, _, k_part = name.removeprefix("draft:").rpartition(":")
        m = re.fullmatch(r"k(\d+)", k_part)
        if not spec or m is None or int(m.group(1)) < 1:
            raise ValueError(f"{name}: use draft:<model|ngram|suffix>:k<K>, e.g. draft:suffix:k4")
        return Config(name, "tandem", int(m.group(1)), StackKey(queue_policy=queue_policy, draft_model=spec))
    if name.startswith("protocol:"):  # protocol:<unary|stream>:k<K>: the worker protocol side by side
        m = re.fullmatch(r"protocol:(unary|stream):k(\d+)", name)
        if m is None:
            raise ValueError(f"{name}: use protocol:unary:k<K> or protocol:stream:k<K> (k0: no speculation)")
        k = int(m.group(2))
        return Config(name, "tandem", k or "off", StackKey(queue_policy=queue_policy, worker_protocol=m.group(1)))
    if name == "hf-target":
        return Config(name, "hf", "off")
    if name == "hf-assisted":
        return Config(name, "hf", "assisted")
    if name == "hf-assisted-heuristic":
        return Config(name, "hf", "assisted", hf_options=dict(HF_ASSISTED_HEURISTIC))
    raise ValueError(
        f"unknown configuration {name!r}; use target-only, tandem-k<K>, policy:<name>, order:<queue>, faser:<variant>, "
        "offload:on|off, draft:<draft>:k<K>, draft:<draft>@<policy>, protocol:<p>:k<K>, chunk:<N|off>:<config>, hf-target, hf-assisted or "
        "hf-assisted-heuristic"
    )


def parse_list(names: str | list[str], *, queue_policy: str = "fcfs") -> list[Config]:
    items = names.split(",") if isinstance(names, str) else names
    configs = [parse(n.strip(), queue_policy=queue_policy) for n in items if n.strip()]
    seen = [c.name for c in configs]
    if len(set(seen)) != len(seen):
        raise ValueError(f"configuration listed twice: {seen}")
    return configs


def rotated(configs: list[Config], shift: int) -> list[Config]:
    """``configs`` started at position ``shift`` (mod n): the order of repeat ``shift``."""
    if not configs:
        return []
    s = shift % len(configs)
    return configs[s:] + configs[:s]
