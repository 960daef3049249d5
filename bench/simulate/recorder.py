"""Record acceptance traces from real runs: an IterationObserver the benches attach to a Scheduler.

    recorder = AcceptanceRecorder(draft="smollm2-draft", target="smollm2-135m-instruct")
    scheduler.add_observer(recorder)
    recorder.tag(request_id, "code", prompt_key(prompt_ids))  # kind (and prompt) of each request, at submission
    ...
    recorder.trace(source="...").save(path)     # acceptance.py's JSON

Every verified chain step counts under its request's kind and under ``all``:
the positions the target compared and the ones it accepted (acceptance.py). Trees
are left out (their acceptance depends on the width as well as the depth); a
finished request adds its own accepted / drafted rate. A request tagged with its
prompt's key also counts its steps under that prompt (its most specific kind's
``prompts``), so a simulation of the same prompts replays each one's acceptance.
"""

from __future__ import annotations

from collections import defaultdict

from bench.simulate.acceptance import ALL, AcceptanceTrace, PositionCounts, Positions
from scheduler.report import StepReport
from scheduler.request import Request
from scheduler.workers import NullObserver


class AcceptanceRecorder(NullObserver):
    def __init__(self, draft: str, target: str) -> None:
        self.draft, self.target = draft, target
        self.kinds: dict[str, str] = {}  # request id -> prompt kind
        self.prompts: dict[str, str] = {}  # request id -> prompt_key
        self.counts: dict[str, PositionCounts] = defaultdict(PositionCounts)
        self.num_tree_steps = 0

    def tag(self, request_id: str, kind: str, prompt: str | None = None) -> None:
        self.kinds[request_id] = kind
        if prompt is not None:
            self.prompts[request_id] = prompt

    def on_step(self, report: StepReport) -> None:
        for o in report.outcomes:
            if not o.num_drafted:
                continue
            if o.shape.k <= 0:
                self.num_tree_steps += 1
                continue
            kinds = self._kinds(o.request_id)
            for kind in kinds:
                self.counts[kind].add_step(o.num_drafted, o.num_accepted)
            prompt = self.prompts.get(o.request_id)
            if prompt is not None:  # under its most specific kind only
                self.counts[kinds[0]].add_prompt_step(prompt, o.num_drafted, o.num_accepted)

    def on_finish(self, request: Request) -> None:
        self.prompts.pop(request.id, None)
        if request.num_drafted_tokens:
            rate = request.num_accepted_tokens / request.num_drafted_tokens
            for kind in self._kinds(request.id):
                self.counts[kind].request_rates.append(rate)

    def _kinds(self, request_id: str) -> tuple[str, ...]:
        kind = self.kinds.get(request_id)
        return (ALL,) if kind is None or kind == ALL else (kind, ALL)

    def merge(self, other: AcceptanceRecorder) -> None:
        """Add ``other``'s counts (one recorder per scheduler, one trace per draft)."""
        for kind, c in other.counts.items():
            mine = self.counts[kind]
            mine.merge(c)
            mine.request_rates += c.request_rates
            for key, positions in c.prompts.items():
                mine.prompts.setdefault(key, Positions()).merge(positions)
        self.num_tree_steps += other.num_tree_steps

    def trace(self, source: str = "") -> AcceptanceTrace:
        """The trace so far; ValueError (pydantic's) when no chain step was recorded."""
        return AcceptanceTrace(draft=self.draft, target=self.target, source=source, kinds=dict(self.counts))

