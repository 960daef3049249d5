"""The iteration loop (architecture.md §2): admit → prefill → plan → speculate → select → verify → commit.

    submit() ─▶ waiting ──admit──▶ running ──finish/abort/fail──▶ (released on both workers)
                   ▲                  │
                   └────preempt───────┘

One ``step`` is one target forward for every running request::

    admit      queue policy picks from waiting (batch-size and token caps)
    prefill    target.prefill(new) ‖ draft.prefill(new that may speculate)   -> first tokens
    plan       speculation policy: a shape per running request
    speculate  ONE draft.speculate for all speculating requests (their tokens since the last call)
    select     tree selector prunes under the budget (default: keep all)
    verify     ONE target.verify for all running requests (empty tree = plain decode)
    commit     append, stop checks (truncating past a stop), stream, finish, release

Chunked prefill: prefill_chunks.py. Drafting beside the commit: draft_relay.py, draft_ahead.py, frontier.py.
Failures: a failed draft means plain decoding until a retry resyncs it (draft_link.py); a target outage is
waited out, its requests re-prefilled (target_link.py); any other target error fails that call's requests.
Preemption and KV pressure: admission.py; elastic draft memory (Nightjar §5): elastic_control.py. Workers
see releases only between calls, never during one. No torch, grpc or redis here: all injected.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence

from scheduler.admission import AdmissionControl
from scheduler.draft_ahead import DraftAhead
from scheduler.draft_relay import DraftRelay
from scheduler.verify_ahead import VerifyAhead
from scheduler.draft_link import DraftLink
from scheduler.elastic_control import ElasticControl
from scheduler.feature_relay import FeatureRelay
from scheduler.frontier import FrontierPipeline
from scheduler.observer_calls import DeferredCalls, ObserverSplit, call_all
from scheduler.prefill_chunks import ChunkedPrefill
from scheduler.policies.elastic_memory import ElasticDraftMemory
from scheduler.policies.queue import FCFS, QueuePolicy, reserved_tokens
from scheduler.policies.selection import PassThrough, TreeSelector
from scheduler.policies.speculation import (NoSpeculation, SpecContext, SpecShape, SpeculationPolicy, explained,
                                           plan_shapes, step_batch, wants_draft)  # fmt: skip
from scheduler.loop_config import SchedulerConfig  # noqa: F401 - re-exported: callers build it from here
from scheduler.report import RequestOutcome, StepReport
from scheduler.request_stream import RequestStream, TokenEvent  # noqa: F401 - re-exported too
from scheduler.stops import first_stop
from scheduler.target_link import TargetLink, error_status
from scheduler.tree_outcome import keep_logprobs, record_acceptance, tree_ok
from scheduler.request import FinishReason, Request, RequestState, validate_request
from scheduler.yield_probe import YieldProbe
from scheduler.workers import Clock, DraftWorker, IterationObserver, RealClock, TargetWorker
from shared.engine.types import AcceptResult, PrefillItem, TokenTree, VerifyItem

log = logging.getLogger(__name__)

Detokenize = Callable[[Sequence[int]], str]


class Scheduler:
    def __init__(
        self,
        target: TargetWorker,
        draft: DraftWorker | None = None,
        *,
        config: SchedulerConfig | None = None,
        clock: Clock | None = None,
        spec_policy: SpeculationPolicy | None = None,
        queue_policy: QueuePolicy | None = None,
        selector: TreeSelector | None = None,
        detokenize: Detokenize | None = None,
        observers: Iterable[IterationObserver] = (),
    ) -> None:
        self.target = target
        self.draft = draft
        self.config = config or SchedulerConfig()
        self.clock = clock or RealClock()
        self.spec_policy = spec_policy or NoSpeculation()
        self.queue_policy = queue_policy or FCFS()
        self.selector = selector or self.spec_policy.tree_selector() or PassThrough()
        self.detokenize = detokenize
        self.observers: list[IterationObserver] = list(observers)
        self.deferred = DeferredCalls()  # observers that run while the next step's workers compute
        self._observer_split = ObserverSplit()  # which of them are deferrable, known until the list changes

        self._waiting: list[Request] = []
        self._running: dict[str, Request] = {}  # insertion order = admission order
        self._streams: dict[str, RequestStream] = {}
        self._release_target: list[str] = []
        self._finished_unnotified: list[Request] = []
        self._num_steps = 0
        self._wakeup = asyncio.Event()
        self._yields = YieldProbe()  # whether a step waited for its workers (run skips its sleep(0) then)
        self._stopping = False

        cfg = self.config
        # a feature-level draft (EAGLE family) reads target features: the target returns them, the loop relays them
        spec = getattr(draft, "feature_spec", None)
        self.features = FeatureRelay(spec, source=draft) if spec is not None else None
        # draft health, releases and resync (draft_link.py); elastic memory (elastic_control.py)
        self.link = DraftLink(
            draft,
            self.clock,
            retry_initial_s=cfg.draft_retry_initial_s,
            retry_max_s=cfg.draft_retry_max_s,
            target=target,
            features=self.features,
        )
        self.elastic = (
            ElasticControl(ElasticDraftMemory(cfg.draft_memory), cfg, target, self.link)
            if cfg.draft_memory and draft is not None
            else None
        )
        self.frontier = FrontierPipeline(cfg.frontier) if cfg.frontier is not None and draft is not None else None
        # the next tree drafted as soon as a verify's outcome is in: straight from the target (draft_relay.py) where
        # the target relays and every drafted node is verified, else sent by the loop (draft_ahead.py); not beside
        # frontier pipelining, which overlaps drafting its own way, nor for feature drafts (features arrive later)
        ahead = draft is not None and self.frontier is None and self.features is None
        cut = isinstance(self.selector, PassThrough) or getattr(self.selector, "cut_by_target", False)
        self.relay = DraftRelay() if ahead and cfg.draft_relay and cut else None
        self.ahead = DraftAhead() if ahead and cfg.draft_ahead and self.relay is None else None
        self.verify_ahead = VerifyAhead() if self.relay is not None and self.spec_policy.static_shapes else None
        self.chunks = ChunkedPrefill(cfg.prefill_chunk if self.frontier is None else 0)
        # admission within the caps, preemption, eviction under KV pressure (admission.py)
        self.admission = AdmissionControl(self.queue_policy, cfg, self.link,
                                          lambda seq_id: self._release_target.append(seq_id))
        # target health: an outage is waited out and its requests re-prefilled (target_link.py)
        self.target_link = TargetLink(getattr(target, "info", None), cfg.target_recovery)
        want = getattr(target, "want_features", None)  # through wrappers (tracing, ledger) to the worker itself
        if want is not None:
            want(spec)
        elif spec is not None:
            raise ValueError("the draft reads target features, but the target worker cannot return them")

    # ------------------------------------------------------------------ public API
    def submit(self, request: Request) -> RequestStream:
        """Validate (``ValueError``) and queue a request; returns its token stream."""
        validate_request(request, max_total_tokens=self.config.max_tokens_in_flight)
        if request.stop_strings and self.detokenize is None:
            raise ValueError(f"request {request.id}: stop strings need a detokenizer, and this scheduler has none")
        if request.id in self._streams:
            raise ValueError(f"request {request.id}: a request with this id is already live")
        if request.state is not RequestState.WAITING or request.output_ids:
            raise ValueError(f"request {request.id}: only fresh requests can be submitted")
        if request.arrival_time is None:
            request.arrival_time = self.clock.now()
        stream = RequestStream(request)
        self._streams[request.id] = stream
        self._waiting.append(request)
        self._wakeup.set()
        return stream

    def abort(self, request_id: str) -> bool:
        """End a live request now (final ABORTED event); its worker state is released at the next step boundary."""
        req = self.get(request_id)
        if req is None:
            return False
        if req in self._waiting:
            self._waiting.remove(req)
        self._end(req, RequestState.ABORTED, FinishReason.ABORTED)
        self._wakeup.set()
        return True

    def get(self, request_id: str) -> Request | None:
        stream = self._streams.get(request_id)
        return stream.request if stream is not None else None

    @property
    def waiting(self) -> tuple[Request, ...]:
        return tuple(self._waiting)

    @property
    def running(self) -> tuple[Request, ...]:
        return tuple(self._running.values())

    @property
    def draft_available(self) -> bool:
        return self.link.up

    @property
    def draft_offloaded(self) -> bool:
        return self.link.offloaded

    @property
    def num_steps(self) -> int:
        return self._num_steps

    @property
    def max_tokens_in_flight(self) -> int:
        """The KV token budget now: the configured one, plus the grown pool's while the draft is offloaded."""
        return self.config.max_tokens_in_flight + (self.elastic.extra_tokens if self.elastic is not None else 0)

    def has_work(self) -> bool:
        # finished-but-unreported requests count: observers (Redis, traces) must still hear of them
        return bool(
            self._waiting
            or self._running
            or (self._release_target and self.target_link.up)  # while it is down they wait for the next work
            or self.link.pending_release
            or self._finished_unnotified
        )

    def add_observer(self, observer: IterationObserver) -> None:
        self.observers.append(observer)

    async def run(self) -> None:
        """Step while there is work, sleep on new submissions otherwise, until ``stop``.

        ``stop`` before the task first runs (a start-up that fails right after creating it)
        stops it too: nothing here clears the flag."""
        loop = asyncio.get_running_loop()
        while not self._stopping:
            if not self.has_work():
                self.deferred.start()
                self._wakeup.clear()
                if self.link.stale:  # a draft failure left sequences there: released once it answers again
                    await self.link.release_stale_when_idle(self._wakeup)
                else:
                    await self._wakeup.wait()
                continue
            waited = self._yields.mark(loop)
            try:
                await self.step()
            except Exception as exc:  # noqa: BLE001 - a bug must not leave clients waiting forever
                log.exception("scheduler step failed; failing all live requests")
                self._fail_all(exc)
            if not waited():  # stream consumers and submitters ran while it awaited its workers; else now
                await asyncio.sleep(0)
        for ahead in (self.ahead, self.verify_ahead):
            if ahead is not None:
                ahead.cancel()
        await self.deferred.drain()

    def stop(self) -> None:
        self._stopping = True
        self._wakeup.set()

    async def run_until_idle(self, max_steps: int | None = None) -> int:
        """Step until nothing is waiting or running (tests, simulator); returns the number of steps."""
        n = 0
        while self.has_work() and (max_steps is None or n < max_steps):
            await self.step()
            await asyncio.sleep(0)
            n += 1
        await self.deferred.drain()
        return n

    # ------------------------------------------------------------------ one iteration
    async def step(self) -> StepReport:
        clock = self.clock
        t0 = clock.now()
        report = StepReport(step=self._num_steps, started_at=t0)
        times = report.times
        self.link.begin_step()
        self.deferred.start()  # the last step's deferred observers: they run at this step's first worker wait

        # 0. while the target is down nothing runs: probe it, and fail what waited past the bound
        if not self.target_link.up and not await self._await_target(report):
            return report
        va = self.verify_ahead  # this step's verify, if it left as soon as the last one was in (verify_ahead.py)
        ahead, times.verify = await va.collect(self, report) if va is not None and va.pending else None, clock.now() - t0

        # 1. admit (and preempt); not while a verify that went ahead commits: a request it preempted kept them
        new = self._admit(report) if ahead is None else []
        await self._flush_releases()

        # 2. prefill
        t = clock.now()
        if new := self.chunks.take(new, self):  # long prompts go in chunks, in step 6's forward
            await self._prefill(new, report)
        times.prefill = clock.now() - t

        if ahead is not None:  # this step's verify left as soon as the last one was in (verify_ahead.py)
            batch, shapes, trees, results = ahead
        else:
            # 3. plan
            batch = self.chunks.ready(self._running.values())
            self.link.probe()  # after a failure's backoff: the resync in _speculate tells whether it is back
            ctx = SpecContext(now=clock.now(), step=self._num_steps, draft_available=self.link.usable,
                              token_budget=self.chunks.plan(batch, clock.now(), self.config, self),
                              cost_model=self.config.cost_model, draft_cost_model=self.config.draft_cost_model,
                              max_tokens_in_flight=self.max_tokens_in_flight)  # fmt: skip
            try:
                batch = step_batch(self.spec_policy, batch, ctx, self._running)  # a prefix of it (SmartSpec Alg. 2)
                shapes = plan_shapes(self.spec_policy, batch, ctx)
            except Exception:  # noqa: BLE001 - a policy bug costs speed, not requests
                log.exception("speculation policy failed; plain decoding this step")
                shapes = [SpecShape.none()] * len(batch)
            else:
                report.policy = explained(self.spec_policy) if batch and ctx.draft_available else {}

            # 4. speculate (frontier pipelining runs 4-6 itself: verify chunk i while drafting chunk i+1)
            t = clock.now()
            piped = await self.frontier.run(self, batch, shapes, ctx, report) if self.frontier is not None else None
            trees = piped.trees if piped is not None else await self._speculate(batch, shapes, report)
            times.speculate = piped.speculate_s if piped is not None else clock.now() - t

            # 5. select
            t = clock.now()
            if piped is None and any(len(tree) for tree in trees):
                try:
                    selected = self.selector.select(batch, trees, ctx)
                    if len(selected) != len(batch) or not all(tree_ok(tree) for tree in selected):
                        raise ValueError("selector must return one well-formed tree per request")
                    trees = selected
                except Exception:  # noqa: BLE001
                    log.exception("tree selector failed; plain decoding this step")
                    trees = [TokenTree() for _ in batch]
            times.select = clock.now() - t

            # 6. verify
            t = clock.now()
            if piped is not None:
                results, times.verify = piped.results, piped.verify_s
            else:
                results = await self._verify(batch, trees, report, shapes) if batch or self.chunks.planned else []
                times.verify = clock.now() - t
                if self.ahead is not None and results and self.link.usable and not self.link.stale:
                    if self.ahead.start(self.draft, batch, shapes, results):  # drafts while this step commits
                        await asyncio.sleep(0)  # its plan leaves now, so the draft drafts while this step commits
        if self.relay is not None and results:  # the relayed trees the target verified, the handoffs it made
            self.relay.absorb(batch, shapes, trees, results, self.link)
            if self.verify_ahead is not None and self.verify_ahead.start(self, batch, results):
                await asyncio.sleep(0)  # the next verify leaves now: the target and the draft work while this commits

        # 7. commit
        t = clock.now()
        if results is not None:
            self._commit(batch, shapes, trees, results, report)
        await self._flush_releases()
        times.commit = clock.now() - t
        if self.elastic is not None:
            await self.elastic.after_step(speculated=any(s.speculates for s in shapes), reserved=self._reserved_tokens(),
                                          cap=self.config.max_tokens_in_flight, num_waiting=len(self._waiting),
                                          holders=self._holders(), report=report)  # fmt: skip

        times.total = clock.now() - t0
        if self.frontier is not None:
            self.frontier.after_step(report, self._num_steps)
        times.overhead = times.total - (times.prefill + times.speculate + times.select + times.verify + times.commit)
        for req in batch:  # LAPS-SD §4.2: E_i is speculation + verification time, not the step's prefills
            req.attained_service_s += times.total - times.prefill
            req.attained_rounds += 1
        report.batch_size, report.kv_token_budget = len(batch), self.max_tokens_in_flight
        report.draft_available, report.draft_error, report.draft_offloaded = self.link.up, self.link.error, self.link.offloaded
        self._num_steps += 1
        await self._notify(report)
        return report

    # ------------------------------------------------------------------ phases
    def _admit(self, report: StepReport) -> list[Request]:
        """Apply the queue policy's admission; returns the requests that need a prefill (not resumed ones)."""
        return self.admission.admit(self._waiting, self._running, self.max_tokens_in_flight, self.clock.now(), report)

    async def _prefill(self, new: list[Request], report: StepReport) -> None:
        # a preempted request comes back with its output so far; the target continues after it
        items = [PrefillItem(r.id, r.tokens(), r.sampling, num_prompt_tokens=len(r.prompt_ids),
                             cache_salt=r.cache_salt, grammar=r.grammar) for r in new]
        to_draft = [
            r
            for r in new
            if self.link.usable and wants_draft(self.spec_policy, r)
            and self.features is None  # a feature draft waits for the target's features: prefilled at its first speculate
        ]
        calls = [self.target.prefill(items)]
        if to_draft:
            calls.append(self.draft.prefill([it for it, r in zip(items, new) if r in to_draft]))
        outcomes = await asyncio.gather(*calls, return_exceptions=True)

        if to_draft:  # before the target's token is appended: the draft saw tokens() as it was
            if isinstance(outcomes[1], Exception):
                self._draft_failed(outcomes[1], also_stale=[r.id for r in to_draft])
            else:
                for r in to_draft:
                    self.link.mark(r, r.num_tokens)

        results = outcomes[0]
        if isinstance(results, Exception):
            self._fail(new, "target prefill failed", results, report)
            return
        if len(results) != len(new) or any(res.seq_id != r.id for res, r in zip(results, new)):
            self._fail(new, "target prefill returned results that do not match its items", None, report)
            return
        now = self.clock.now()
        for req, res in zip(new, results):
            if req.state is not RequestState.RUNNING:  # aborted while prefilling
                continue
            report.prefilled_ids.append(req.id)
            if self.features is not None:
                self.features.on_prefill(req, res)
            keep_logprobs(req, res)
            report.num_prefill_tokens += len(self._commit_tokens(req, [res.first_token], now))

    async def _speculate(self, batch: list[Request], shapes: list[SpecShape], report: StepReport) -> list[TokenTree]:
        trees = [TokenTree() for _ in batch]
        spec = [(i, r, s) for i, (r, s) in enumerate(zip(batch, shapes)) if s.speculates]
        if self.relay is not None:  # requests with a tree relayed to the target take it (or drop it), undrafted
            spec = self.relay.mark(batch, spec)
        try:
            ahead = await self.ahead.collect() if self.ahead is not None and self.ahead.pending else {}
        except Exception as exc:  # noqa: BLE001 - the call sent ahead failed: a draft failure, as below
            self._draft_failed(exc)
            return trees
        if not spec:
            return trees
        try:
            t = self.clock.now()  # resync requests the draft lacks (recovery, deferred); timed apart: no drafting cost
            await self.link.sync([r for _, r, _ in spec])
            report.times.draft_sync = self.clock.now() - t
            if ahead:  # trees drafted while the last step committed (draft_ahead.py), where the plan is unchanged
                spec = self.ahead.fill(spec, ahead, trees)  # the requests still to draft
            items = [s.spec_item(r.id, r.tokens_from(r.draft_seen), r.draft_rollback) for _, r, s in spec]
            report.num_catchup_tokens = sum(max(0, len(item.new_tokens) - 1) for item in items)
            if self.features is not None:
                for item, (_, r, _) in zip(items, spec):
                    item.features = r.features
            drafted = await self.draft.speculate(items) if items else []
            if len(drafted) != len(items):
                raise RuntimeError(f"draft returned {len(drafted)} trees for {len(items)} items")
            if self.features is not None:
                self.features.sent([r for _, r, _ in spec])
        except Exception as exc:  # noqa: BLE001 - any draft failure degrades to plain decoding
            self._draft_failed(exc)
            return [TokenTree() for _ in batch]

        self.link.recovered()
        for (i, r, _), tree in zip(spec, drafted):
            r.draft_seen, r.draft_rollback = r.num_tokens, 0
            if tree_ok(tree):
                trees[i] = tree
            else:
                log.warning("draft returned a malformed tree for %s; verifying without it", r.id)
        return trees

    async def _verify(self, batch: list[Request], trees: list[TokenTree], report: StepReport,
                      shapes: list[SpecShape] | None = None) -> list[AcceptResult] | None:  # fmt: skip
        items = [VerifyItem(r.id, tree) for r, tree in zip(batch, trees)]
        if self.relay is not None and shapes is not None:  # relay flags, and handoffs (draft_relay.py)
            self.relay.plan(batch, shapes, items, self.link.usable and not self.link.stale)
        try:
            results = await self.chunks.verify(self, items, report)
        except Exception as exc:  # noqa: BLE001 - reported to the requests, not swallowed
            if self.relay is not None:
                self.relay.failed(batch, self.link)
            self._fail(batch, "target verify failed", exc, report)
            return None
        if len(results) != len(items):
            self._fail(batch, f"target verify returned {len(results)} results for {len(items)} items", None, report)
            return None
        return results

    def _commit(
        self,
        batch: list[Request],
        shapes: list[SpecShape],
        trees: list[TokenTree],
        results: list[AcceptResult],
        report: StepReport,
    ) -> None:
        now = self.clock.now()
        features, outcomes, running = self.features, report.outcomes, RequestState.RUNNING
        for req, shape, tree, res in zip(batch, shapes, trees, results):
            if req.state is not running:  # aborted during the step
                continue
            if not res.tokens:
                self._fail([req], "target verify returned no token", None, report)
                continue
            drafted = len(tree.token_ids)
            if drafted:
                record_acceptance(req, tree, res)
            if features is not None and not features.on_verify(req, res):
                self.link.drop(req)  # its held features were dropped: rebuilt from a recomputation if it speculates
            if res.logprobs:
                keep_logprobs(req, res)
            emitted = self._commit_tokens(req, res.tokens, now)
            outcomes.append(RequestOutcome(req.id, shape if drafted else SpecShape.none(), drafted,
                                           len(res.accepted_nodes) if drafted else 0, len(emitted), req.finish_reason,
                                           len(res.pruned_nodes)))  # fmt: skip

    # ------------------------------------------------------------------ tokens and endings
    def _commit_tokens(self, req: Request, tokens: list[int], now: float) -> list[int]:
        """Append tokens up to the first stop (stops.py); stream them; finish the request if it stopped."""
        index = len(req.output_ids)
        take, reason = first_stop(req, tokens, self.detokenize, self.config.stop_string_window)
        emitted = tokens[:take] if take < len(tokens) else list(tokens)
        req.output_ids.extend(emitted)
        req.token_times.extend([now] * take)
        if req.first_token_time is None and take:
            req.first_token_time = now
        if reason is not None:
            self._end(req, RequestState.FINISHED, reason, tokens=emitted, index=index)
        elif emitted:
            self._streams[req.id]._put(TokenEvent(req.id, emitted, index, now, req.state))
        return emitted

    def _end(
        self,
        req: Request,
        state: RequestState,
        reason: FinishReason,
        *,
        tokens: list[int] | None = None,
        index: int | None = None,
        error: str | None = None,
        error_code: str | None = None,
    ) -> None:
        now = self.clock.now()
        req.state, req.finish_reason, req.finish_time = state, reason, now
        req.error, req.error_code = error, error_code
        if self._running.pop(req.id, None) is not None or req.resident:
            self._release_target.append(req.id)
            req.resident = False
        self.link.forget(req)
        stream = self._streams.pop(req.id)
        self._finished_unnotified.append(req)
        stream._put(TokenEvent(req.id, tokens or [], len(req.output_ids) if index is None else index, now, state,
                               finished=True, finish_reason=reason, error=error, error_code=error_code))  # fmt: skip

    def _fail(self, reqs: list[Request], what: str, exc: Exception | None, report: StepReport) -> None:
        if self.target_link.is_outage(exc):  # not the requests' fault: they wait for the target
            self._target_lost(exc)
            return
        msg = what if exc is None else f"{what}: {type(exc).__name__}: {exc}"
        code = error_status(exc)
        log.error("%s; failing %d request(s)", msg, len(reqs))
        for req in reqs:
            if req.state is RequestState.RUNNING:
                self._end(req, RequestState.FAILED, FinishReason.ERROR, error=msg, error_code=code)
                report.failed_ids.append(req.id)

    def _target_lost(self, exc: Exception | None) -> None:
        """The target lost (or may have lost) every sequence: all its requests queue again with their tokens."""
        self.target_link.lost(self.clock.now(), exc)
        for req in [*self._running.values(), *(r for r in self._waiting if r.resident)]:
            self._running.pop(req.id, None)
            if req not in self._waiting:
                req.state = RequestState.WAITING
                self._waiting.append(req)
            self.admission.evict(req)  # re-prefilled (prompt + output) once the target is back, as after a recompute

    async def _await_target(self, report: StepReport) -> bool:
        """Probe a target that is down; True once it serves again (the step goes on)."""
        now = self.clock.now()
        if await self.target_link.probe(now):
            await self._flush_releases()  # the old sequence ids: a target that only hung frees them now
            return True
        if self.target_link.expired(now) and self._waiting:
            msg = f"the target has been unavailable for more than {self.target_link.config.recovery_s:g} s"
            log.error("%s; failing %d waiting request(s)", msg, len(self._waiting))
            for req in list(self._waiting):
                self._waiting.remove(req)
                self._end(req, RequestState.FAILED, FinishReason.ERROR, error=msg, error_code="UNAVAILABLE")
                report.failed_ids.append(req.id)
            self.target_link.restart_window(now)  # later arrivals get a full window of their own
            self._num_steps += 1
            await self._notify(report)
            return False
        await self.clock.sleep(max(0.005, min(0.5, self.target_link.wait_s(now))))
        return False

    def _fail_all(self, exc: Exception) -> None:
        msg = f"scheduler internal error: {type(exc).__name__}: {exc}"
        for req in [*self._waiting, *self._running.values()]:
            if not req.state.done:
                self._end(req, RequestState.FAILED, FinishReason.ERROR, error=msg, error_code="INTERNAL")
        self._waiting.clear()

    # ------------------------------------------------------------------ workers
    def _holders(self) -> list[Request]:
        """Requests whose sequences the workers may hold: running and resident (preempted, KV kept)."""
        return [*self._running.values(), *self._waiting]

    def _draft_failed(self, exc: Exception, also_stale: Iterable[str] = ()) -> None:
        self.link.failed(exc, self._holders(), also_stale)

    def _reserved_tokens(self) -> int:
        """Tokens reserved by running and resident (preempted, KV kept) requests."""
        return sum(reserved_tokens(r) for r in self._running.values()) + sum(
            reserved_tokens(r) for r in self._waiting if r.resident)  # fmt: skip

    async def _flush_releases(self) -> None:
        if self._release_target and self.target_link.up:  # while it is down they wait (release is idempotent)
            ids, self._release_target = self._release_target, []
            try:
                await self.target.release(ids)
            except Exception as exc:  # noqa: BLE001 - the requests are over; a leak is the target's to report
                log.error("target release of %d sequence(s) failed: %s", len(ids), exc)
        await self.link.flush(self._holders())

    async def _notify(self, report: StepReport) -> None:
        """The policies' hooks and the synchronous observers now; the deferrable ones (Redis, metrics) run while
        the next step's workers compute (observer_calls.py)."""
        finished, self._finished_unnotified = self._finished_unnotified, []
        now, later = self._observer_split(self.observers)
        calls = [(self.spec_policy.observe, report), *((self.queue_policy.on_finish, req) for req in finished)]
        calls += [(obs.on_step, report) for obs in now] + [(obs.on_finish, req) for req in finished for obs in now]
        await call_all(calls)
        deferred = [(obs.on_step, report) for obs in later] + [(obs.on_finish, req) for req in finished for obs in later]
        self.deferred.submit(deferred)
