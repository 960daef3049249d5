"""A step plan's continuation steps (TargetPlan.repeat): the steps the target runs by itself after a plan.

    TargetPlan(verify ids, repeat=R) ─▶ outcome (step s) ─▶ continuation ─▶ outcome (s+1) ... (s+R)

Once a plan's step is known to be followed by the same step (decode run-ahead: every sequence decodes
again; relayed verify run-ahead under a fixed policy: every sequence verifies the tree the draft relays
for it), the scheduler sends one plan for R+1 steps, and the target runs the next ones without waiting
for a plan: half the plan messages at R=1, and no scheduler round trip between the two steps. A
continuation verifies the same sequences with no trees of the scheduler's (a plain decode each, or with a
relay, flag 1: the tree the draft relayed for it) and hands them off again with their remaining budget
less what the step emitted; it has no prefills, releases or features. The scheduler, which sent the plan,
knows each continuation's items and reads its outcome as the next step's verify.

A plan that goes on (TargetPlan.goes_on) asks for 1 + R more continuation steps of the last step the
stream ran. The scheduler writes it while that step still runs, so the target reads it as soon as it is
done and never waits for a plan between groups of steps:

    plan s (repeat 1) ─▶ outcome s ─▶ outcome s+1 ─▶ outcome s+2 ─▶ outcome s+3 ...
                                ╰─ goes_on s+2 (repeat 1) is written here, read when s+1 is done
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.rpc.relay_pack import pack_relay
from services.target.relay_plan import relay_items
from shared.engine.types import RELAY_TAKE, AcceptResult, TokenTree, VerifyItem
from shared.rpc.gen.tandem.v1 import common_pb2, target_pb2
from shared.rpc.packing import pack_i32, pack_trees, unpack_i32

MAX_REPEAT = 4  # continuation steps one plan may ask for


def check_repeat(plan: target_pb2.TargetPlan) -> str | None:
    """Why a plan cannot repeat, or None."""
    if plan.repeat > MAX_REPEAT:
        return f"repeat: at most {MAX_REPEAT} continuation steps, not {plan.repeat}"
    if plan.repeat and plan.HasField("features"):
        return "repeat: a plan that asks for features does not repeat"
    return None


@dataclass
class LastStep:
    """The last step a stream ran: what a plan that goes on continues (or the error it answers)."""

    plan: target_pb2.TargetPlan | None = None
    results: list[AcceptResult] = field(default_factory=list)  # its verifies' results, in verify order
    error: common_pb2.StepError | None = None  # it was refused: nothing to go on from

    def ran(self, plan: target_pb2.TargetPlan, reply: target_pb2.TargetOutcome, results: list[AcceptResult]) -> None:
        if reply.HasField("error"):
            self.plan, self.results, self.error = None, [], reply.error
        else:
            self.plan, self.results, self.error = plan, results, None


def check_goes_on(plan: target_pb2.TargetPlan, last: LastStep) -> str | None:
    """Why a plan that goes on cannot (its steps then answer this error), or None."""
    if plan.prefills or plan.verify_ids or plan.releases or plan.HasField("features") or plan.HasField("relay"):
        return "goes_on: a plan that goes on carries only step and repeat"
    if last.plan is None and last.error is None:
        return "goes_on: no step of this stream to go on from"
    return None


def continuation(plan: target_pb2.TargetPlan, results: list[AcceptResult]) -> target_pb2.TargetPlan:
    """The step after ``plan``, whose verifies committed ``results`` (in verify order)."""
    n = len(plan.verify_ids)
    nxt = target_pb2.TargetPlan(step=plan.step + 1, verify_ids=plan.verify_ids, trees=pack_trees([TokenTree()] * n))
    nxt.trace_context.update(plan.trace_context)
    if not plan.HasField("relay"):
        return nxt
    emitted = {seq_id: len(res.tokens) for seq_id, res in zip(plan.verify_ids, results)}
    if plan.relay.HasField("chains"):  # most plans: the columns again, no new tokens, less budget
        chains = plan.relay.chains
        nxt.relay.draft = plan.relay.draft
        nxt.relay.chains.CopyFrom(chains)
        nxt.relay.chains.num_new_tokens = pack_i32([0] * len(chains.seq_ids))
        nxt.relay.chains.new_tokens = b""
        nxt.relay.chains.rollbacks = b""
        remaining = unpack_i32(plan.relay.remaining, "relay remaining")
        nxt.relay.remaining = pack_i32([r - emitted.get(s, 0) for s, r in zip(chains.seq_ids, remaining)])
        handed = set(chains.seq_ids)
        nxt.relay_flags = bytes(RELAY_TAKE if s in handed else 0 for s in plan.verify_ids)
        return nxt
    handoffs = {item.seq_id: (item, remaining) for item, remaining in relay_items(plan.relay)}
    verifies = []
    for seq_id in plan.verify_ids:
        if seq_id in handoffs:
            item, remaining = handoffs[seq_id]
            item.new_tokens = []
            verifies.append(VerifyItem(seq_id, relay=RELAY_TAKE, handoff=item, remaining=remaining - emitted.get(seq_id, 0)))
        else:
            verifies.append(VerifyItem(seq_id))  # not relayed: a plain decode step
    pack_relay(nxt, verifies, plan.relay.draft)
    return nxt


def refused(step: int, error: common_pb2.StepError) -> target_pb2.TargetOutcome:
    """A continuation of a refused plan: the same error, nothing committed."""
    return target_pb2.TargetOutcome(step=step, error=error)
