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

from shared.engine.types import RELAY_TAKE, AcceptResult, SpecItem, VerifyItem
from shared.rpc.gen.tandem.v1 import common_pb2, target_pb2

MAX_REPEAT = 4  # continuation steps one plan may ask for


def check_repeat(plan: target_pb2.TargetPlan) -> str | None:
    """Why a plan cannot repeat, or None."""
    if plan.repeat > MAX_REPEAT:
        return f"repeat: at most {MAX_REPEAT} continuation steps, not {plan.repeat}"
    if plan.repeat and plan.HasField("features"):
        return "repeat: a plan that asks for features does not repeat"
    return None


@dataclass
class StepItems:
    """A step's verifies and draft handoffs in the engine's types (step_stream.run_target_plan): read from its plan,
    or, for a continuation, made from the last step's without a round trip through protobuf."""

    verifies: list[VerifyItem] | None = None
    handoffs: list[tuple[SpecItem, int]] | None = None  # (a sequence's next speculation, what it may still emit)


@dataclass
class LastStep:
    """The last step a stream ran: what a plan that goes on continues (or the error it answers)."""

    plan: target_pb2.TargetPlan | None = None
    results: list[AcceptResult] = field(default_factory=list)  # its verifies' results, in verify order
    error: common_pb2.StepError | None = None  # it was refused: nothing to go on from
    items: StepItems = field(default_factory=StepItems)  # its verifies and handoffs, as it read them
    ids: list[str] = field(default_factory=list)  # the verify ids of ``continued``, read off the protobuf once
    continued: target_pb2.TargetPlan | None = None  # the continuation plan built last: the steps after it run it again

    def ran(self, plan: target_pb2.TargetPlan, reply: target_pb2.TargetOutcome, results: list[AcceptResult],
            items: StepItems) -> None:  # fmt: skip
        if reply.HasField("error"):
            self.plan, self.results, self.error, self.items = None, [], reply.error, StepItems()
        else:
            self.plan, self.results, self.error, self.items = plan, results, None, items


def check_goes_on(plan: target_pb2.TargetPlan, last: LastStep) -> str | None:
    """Why a plan that goes on cannot (its steps then answer this error), or None."""
    if plan.prefills or plan.verify_ids or plan.releases or plan.HasField("features") or plan.HasField("relay"):
        return "goes_on: a plan that goes on carries only step and repeat"
    if last.plan is None and last.error is None:
        return "goes_on: no step of this stream to go on from"
    return None


def continuation(last: LastStep) -> tuple[target_pb2.TargetPlan, StepItems]:
    """The step after the last one, whose verifies committed ``last.results`` (in verify order): a plan that carries
    only what the step's span and outcome read (ids, the draft's address, relay flags, trace context), and its
    items made directly: each sequence verifies again with no tree of the scheduler's, and each relayed one takes
    the tree the draft relays and is handed off again in its shape, with no new tokens and its budget less what
    the last step emitted."""
    plan, handoffs = last.plan, last.items.handoffs
    if plan is last.continued:  # a continuation's continuation: the same plan, one step on (each reads only its
        nxt, ids = plan, last.ids  # step off it while it runs), its ids and flags as they were
        nxt.step = plan.step + 1
    else:
        ids = list(plan.verify_ids)
        nxt = target_pb2.TargetPlan(step=plan.step + 1, verify_ids=ids)
        nxt.trace_context.update(plan.trace_context)
        if handoffs is not None:
            nxt.relay.draft = plan.relay.draft
            handed = {item.seq_id for item, _ in handoffs}  # every continuation hands off the same sequences
            nxt.relay_flags = bytes(RELAY_TAKE if seq_id in handed else 0 for seq_id in ids)
        last.ids, last.continued = ids, nxt
    verifies = [VerifyItem(seq_id) for seq_id in ids]
    if handoffs is None:
        return nxt, StepItems(verifies)
    emitted = {seq_id: len(res.tokens) for seq_id, res in zip(ids, last.results)}
    again = [(SpecItem(i.seq_id, [], i.chain_len, i.tree_depth, i.tree_width, i.confidence_threshold, i.tree_expansion),
              remaining - emitted.get(i.seq_id, 0)) for i, remaining in handoffs]  # fmt: skip
    return nxt, StepItems(verifies, again)


def refused(step: int, error: common_pb2.StepError) -> target_pb2.TargetOutcome:
    """A continuation of a refused plan: the same error, nothing committed."""
    return target_pb2.TargetOutcome(step=step, error=error)
