"""Scheduling policies: pure code over plain data (Requests, shapes, trees); no I/O."""

from scheduler.policies.adaserve import AdaServe, EqualGreedy, GlobalGreedy, SpecInferTree, TreePolicyConfig
from scheduler.policies.queue import FCFS, Admission, Capacity, QueuePolicy
from scheduler.policies.selection import PassThrough, TreeSelector
from scheduler.policies.speculation import (
    FixedChain,
    NoSpeculation,
    SpecContext,
    SpecShape,
    SpeculationPolicy,
    plan_shapes,
    wants_draft,
)

__all__ = [
    "AdaServe",
    "EqualGreedy",
    "GlobalGreedy",
    "SpecInferTree",
    "TreePolicyConfig",
    "FCFS",
    "Admission",
    "Capacity",
    "QueuePolicy",
    "PassThrough",
    "TreeSelector",
    "FixedChain",
    "NoSpeculation",
    "SpecContext",
    "SpecShape",
    "SpeculationPolicy",
    "plan_shapes",
    "wants_draft",
]
