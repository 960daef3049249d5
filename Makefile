# Tandem developer entry points. CI runs `make test` (.ci/run) on a fresh clone, so every
# step a test needs must be reachable from here, not installed by hand.
#
#   make setup    .venv with the pinned CPU torch + tandem[dev], then gRPC code
#   make models   prepare the demo pair's models under $TANDEM_HOME (default ~/.cache/tandem)
#   make test     setup + models, then the whole test suite
#   make compose-smoke  build the images offline, run docker compose up (CPU), serve, kill, trace (deploy/)
#   make compose-smoke-tls  the same with TLS outside and mutual TLS inside (deploy/tls.env.example)
#   make demo | trace-ui | profile | bench-engine | bench | bench-slo | bench-adaptive | bench-faser | bench-offload | soak
#   make clean | distclean

SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# The local CPU wheel. Installed first and alone: with it in place pyproject's torch>=2.5 is
# already satisfied, so pip never resolves a (multi-GB, CUDA) torch from an index.
TORCH := torch==2.13.0
PAIR ?= demo
PYTEST_ARGS ?=
# Test processes (pytest-xdist; 0 = serial, in this process), whole files to a worker (--dist loadfile: a
# module-scoped stack starts once). Two workers, each torch process on one thread (OMP_NUM_THREADS=1, which the
# services started by tests inherit): with two threads per process, two workers and the stacks they start
# oversubscribe the cores and every parallel region waits for a descheduled thread (an early-exit test took
# 12.9 s beside another worker against 1.4 s alone). pytest 525 s on one thread against 837 s on torch's default,
# 2-core AMD EPYC (docs/development.md). tests/conftest.py holds grpc.aio's poller for the run (a worker once
# died in a native thread when it restarted).
TEST_WORKERS ?= 2
TEST_THREADS ?= 1
# OpenMP waits (libgomp): sleep rather than spin for long (the services share the cores), but
# spin ~0.1 ms first, which keeps a forward's thousands of short parallel regions from paying a
# wake-up each (SmolLM2-135M decode 34 ms against 59 ms fully passive, 2 cores; docs/engine.md).
# The launcher sets the same for the services it starts.
export GOMP_SPINCOUNT ?= 10000

.PHONY: help setup protos models promtool test compose-smoke compose-smoke-tls demo trace-ui profile bench-engine bench bench-serving bench-slo bench-adaptive bench-order bench-faser bench-exit-signal bench-offload bench-drafts bench-grounded bench-http soak clean distclean

help:
	@sed -n '4,10p' Makefile | sed 's/^# \{0,1\}//'

setup: $(VENV)/.stamp
	@$(MAKE) --no-print-directory protos

# Re-run only when pyproject.toml changes; every step is safe to repeat on an existing venv.
$(VENV)/.stamp: pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
		|| { echo "Tandem needs Python >= 3.11; got $(PYTHON) ($$($(PYTHON) --version 2>&1))"; exit 1; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	@echo "installing $(TORCH) (local CPU wheel), then tandem[dev] ..."
	$(PIP) install -q '$(TORCH)'
	@# The pin again: even a dependency that wanted another torch cannot make pip swap it.
	$(PIP) install -q -e '.[dev]' '$(TORCH)'
	@$(PY) -c 'import torch, sys; v = torch.__version__; print("torch", v); sys.exit(v.split("+")[0] != "2.13.0")'
	@touch $@

protos: $(VENV)/.stamp
	@if [ -f shared/rpc/build.py ]; then \
		$(PY) -m shared.rpc.build; \
	else \
		echo "note: shared/rpc/build.py does not exist yet; no gRPC code generated"; \
	fi

models: setup
	$(VENV)/bin/tandem models prepare --pair $(PAIR)

# promtool (Debian's prometheus package) for the exposition check in tests/services/scheduler/test_metrics_exposition.py:
# installed where apt and root are at hand, else that check is skipped
promtool:
	@command -v promtool >/dev/null || { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] \
		&& DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; } \
		|| echo "note: promtool not installed; the promtool check is skipped"

test: setup models promtool
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-$(TEST_THREADS)} OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE} $(PY) -m pytest -q tests -n $(TEST_WORKERS) --dist loadfile --durations=15 $(PYTEST_ARGS)

# `docker compose up` for real on this machine (deploy/compose_smoke.py): a Docker daemon (started here if none
# answers: vfs, its own data root), a base image from Debian packages, the CPU image from a wheelhouse, the stack
# up with the demo pair, 24 requests through SDK and HTTP with draft and target crashed mid-load, a trace in the
# trace UI, all torn down. Results: bench/results/compose-smoke/. Needs root (dockerd, debootstrap).
compose-smoke: setup models
	$(PY) deploy/compose_smoke.py $(SMOKE_ARGS)

# The same with deploy/tls.env.example: TLS on the public gRPC and HTTPS ports, mutual TLS inside, the
# healthchecks probing with TLS, plaintext and keyless clients refused. Results: bench/results/compose-smoke/tls/.
compose-smoke-tls: setup models
	$(PY) deploy/compose_smoke.py --tls $(SMOKE_ARGS)


# The demo serves with the strongest prepared draft on its prompts (sdk/demo.py DEMO_DRAFT, measured by
# bench.demo_drafts: bench/results/demo-drafts/), preparing it first; DEMO_ARGS="--pair demo" serves another.
DEMO_ARGS ?=
demo: setup models
	$(PY) -m sdk.demo $(DEMO_ARGS)

# Arize Phoenix, a local trace UI: UI http://127.0.0.1:6006, OTLP/gRPC 127.0.0.1:4317, both on loopback only
# (TRACE_UI_HOST=0.0.0.0 to open them to the network); prints the exact URL of Tandem's traces (deploy/trace_ui.py).
# It gets a venv of its own, at a pinned version: it is a separate app, and its ~100 dependencies stay out of the
# serving venv. Then: TANDEM_TRACE_EXPORTER=otlp tandem up   (or make demo with the same variable)
TRACE_UI_VENV := .venv-trace-ui
PHOENIX_VERSION := 20.26.1
TRACE_UI_HOST ?= 127.0.0.1
trace-ui:
	@test -x $(TRACE_UI_VENV)/bin/python || $(PYTHON) -m venv $(TRACE_UI_VENV)
	@$(TRACE_UI_VENV)/bin/python -c 'import importlib.metadata as m, sys; sys.exit(m.version("arize-phoenix") != "$(PHOENIX_VERSION)")' 2>/dev/null \
		|| { echo "installing arize-phoenix==$(PHOENIX_VERSION) into $(TRACE_UI_VENV) (a few minutes, once) ..."; \
		     $(TRACE_UI_VENV)/bin/pip install -q 'arize-phoenix==$(PHOENIX_VERSION)'; }
	@PHOENIX_HOST=$(TRACE_UI_HOST) $(TRACE_UI_VENV)/bin/python deploy/trace_ui.py

# Passive OpenMP waits: spinning threads distort timings badly when the cores are shared.
bench-engine: setup models
	OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE} $(PY) -m bench.engine_bench

# The target's verify latency vs batched tokens and context on this machine: budget B and the cost model,
# stored under $TANDEM_HOME/profiles/<model>/; the scheduler reads them at startup (README, AdaServe).
profile: setup models
	OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE} $(VENV)/bin/tandem profile --pair $(PAIR)
	OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE} $(VENV)/bin/tandem profile --pair $(PAIR) --draft

# AdaServe's comparison (bench.harness --slo): target-only, tandem-k3, SpecInfer tree, EqualGreedy, GlobalGreedy
# and AdaServe on the 60/20/20 stringent/moderate/relaxed mix, vs request rate and vs share of stringent requests.
# Profiles the target and the draft first when this machine has no profile of them. Results: bench/results/slo-$(PAIR)/.
# BENCH_ARGS refines the run (e.g. --sweep-requests 8 --rate-factors 2,4).
BENCH_ARGS ?=
bench-slo: setup models
	OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE} $(VENV)/bin/tandem profile --pair $(PAIR) --if-missing
	OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE} $(VENV)/bin/tandem profile --pair $(PAIR) --if-missing --draft
	OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE} $(PY) -m bench.harness --slo --pair $(PAIR) --name slo-$(PAIR) $(BENCH_ARGS)

# Adaptive speculation length (bench.harness --adaptive): target-only, tandem-k1/k3/k5, SmartSpec, FASER
# (and Nightjar once registered) vs Poisson request rate from low to high load, plus one bursty on/off trace.
# Results: bench/results/adaptive-$(PAIR)/.
bench-adaptive: setup models
	OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE} $(VENV)/bin/tandem profile --pair $(PAIR) --if-missing
	OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE} $(VENV)/bin/tandem profile --pair $(PAIR) --if-missing --draft
	OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE} $(PY) -m bench.harness --adaptive --pair $(PAIR) --name adaptive-$(PAIR) $(BENCH_ARGS)

# LAPS-SD's comparison (bench.harness --order): queue policies fcfs, las, lp-sjf, laps-sd, laps-sd:est=1 side by
# side, mean and p99 latency for N = 10,30,50 requests sent at once (mixed prompts, log-uniform 8..256 new tokens),
# the scheduler's batch capped at TANDEM_MAX_BATCH_SIZE (4) so requests queue. Results: bench/results/order-$(PAIR)/.
bench-order: setup models
	OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE} $(VENV)/bin/tandem profile --pair $(PAIR) --if-missing
	OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE} $(VENV)/bin/tandem profile --pair $(PAIR) --if-missing --draft
	OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE} $(PY) -m bench.harness --order --pair $(PAIR) --name order-$(PAIR) $(BENCH_ARGS)

# The serving benchmark's short default suite (< 10 min on 2 cores): batch-1 rotation of target-only, HF generate, HF assisted
# generation (fixed and heuristic schedule) and Tandem k = 1, 3, 5, then a short Poisson sweep, all side by side
# through the SDK and services. Results: bench/results/serving-$(PAIR)/. --long for the longer sweeps.
bench-serving: setup models
	OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE} $(PY) -m bench.harness --pair $(PAIR) --name serving-$(PAIR) $(BENCH_ARGS)

# FASER's ablation (bench.harness --faser): serial SD, +frontier pipelining (TANDEM_FRONTIER=chunk=2), +token-wise
# early exit (TANDEM_EARLY_EXIT=on), both; a chain of 4 per request, draft and target splitting the machine
# (draft share 0.5: threads on CPU, MPS percentages on CUDA); batch 1, then Poisson at 0.5x and 4x capacity.
# Results: bench/results/faser-$(PAIR)/.
bench-faser: setup models
	OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE} $(VENV)/bin/tandem profile --pair $(PAIR) --if-missing
	OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE} $(VENV)/bin/tandem profile --pair $(PAIR) --if-missing --draft
	OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE} $(PY) -m bench.harness --faser --pair $(PAIR) --name faser-$(PAIR) $(BENCH_ARGS)

# FASER's early-exit signal on the pair's target (bench.diagnostics.exit_signal): per layer, the share of rejected / accepted
# drafted tokens outside the top-K of their parent row's logit lens. Results: bench/results/exit-signal-$(PAIR)/.
bench-exit-signal: setup models
	OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE} $(PY) -m bench.diagnostics.exit_signal --pair $(PAIR) $(BENCH_ARGS)

# Nightjar's elastic draft memory (bench.harness --offload): two stacks under a deliberately small KV pool
# (bench.offload.pool_env: TANDEM_NUM_BLOCKS, TANDEM_KV_GROW_BLOCKS = the draft's footprint in target blocks),
# identical but for TANDEM_DRAFT_OFFLOAD, SmartSpec deciding k; closed loop at 4 and 12 concurrent requests:
# throughput, mean latency, offloads/reloads and the KV budget over time. Results: bench/results/offload-$(PAIR)/.
bench-offload: setup models
	OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE} $(VENV)/bin/tandem profile --pair $(PAIR) --if-missing
	OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE} $(VENV)/bin/tandem profile --pair $(PAIR) --if-missing --draft
	OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE} $(PY) -m bench.harness --offload --pair $(PAIR) --name offload-$(PAIR) $(BENCH_ARGS)

# The policy benches where speculation pays, grounded prompts with the suffix draft (per-request trees:
# configurations sharing a stack must not feed each other), 3 interleaved repeats each, then the goals table
# (bench/results/goals/). About 2 hours on the 2-core CPU. LAS is left out of the order bench: with 1,500-token
# prompts its preemptions re-prefill constantly (5-7x the others' time per run).
GROUNDED := --workload grounded --draft-model suffix:global_tokens=0 --interleave
bench-grounded: setup models
	OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE} $(VENV)/bin/tandem profile --pair $(PAIR) --if-missing
	OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE} $(PY) -m bench.harness --adaptive --pair $(PAIR) --name adaptive-grounded $(GROUNDED) --sweep-requests 8 --rate-factors 0.5,1,2,4 --sweep-repeats 3
	OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE} $(PY) -m bench.harness --order --pair $(PAIR) --name order-grounded $(GROUNDED) --sweep order:fcfs,order:lp-sjf,order:laps-sd,order:laps-sd:est=1 --concurrency 30,50 --sweep-repeats 3
	OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE} $(PY) -m bench.harness --faser --pair $(PAIR) --name faser-grounded $(GROUNDED) --repeats 3 --sweep ''
	OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE} $(PY) -m bench.harness --slo --pair $(PAIR) --name slo-grounded $(GROUNDED) --sweep-requests 10 --rate-factors 2,4 --stringent-shares '' --sweep-repeats 3
	$(PY) -m bench.goals_table --suffix grounded

# The drafts side by side (bench.drafts): target-only, the EAGLE-3 feature draft (chains of 2 and 4; needs
# `tandem models prepare --pair eagle`, done here), the ngram and the suffix draft (chains of 4), on open chat and on
# grounded prompts, at batch 1 and 4 at once, 3 interleaved repeats, by task kind. Results: bench/results/drafts-$(PAIR)/.
bench-drafts: setup models
	$(VENV)/bin/tandem models prepare --pair eagle
	OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE} $(PY) -m bench.drafts --pair $(PAIR) $(BENCH_ARGS)

# The HTTP API against the gRPC endpoint (bench.http_overhead): the same greedy requests both ways on one
# stack, interleaved, at batch 1 (time per token) and under load (tokens/s). Results: bench/results/http-$(PAIR)/.
bench-http: setup models
	OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE} $(PY) -m bench.http_overhead --pair $(PAIR) $(BENCH_ARGS)

# The soak with faults (bench.soak): SOAK_REQUESTS requests at SOAK_CONCURRENCY while the draft, the
# target and Redis are each killed and restarted SOAK_FAULTS times; lost requests, greedy outputs against a
# fault-free reference, RSS, KV idle, p99. Results: bench/results/soak-$(PAIR)/. A short version runs in make test.
SOAK_REQUESTS ?= 2000
SOAK_CONCURRENCY ?= 32
SOAK_FAULTS ?= 10
soak: setup models
	OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE} $(PY) -m bench.soak --pair $(PAIR) --requests $(SOAK_REQUESTS) --concurrency $(SOAK_CONCURRENCY) --faults $(SOAK_FAULTS)

# The short suites; the policy comparisons (bench-slo, bench-adaptive, bench-order) run on their own.
bench: bench-engine bench-serving

# Generated and cached files; keeps .venv and the prepared models (~/.cache/tandem).
clean:
	rm -rf shared/rpc/gen .pytest_cache bench/results/tmp build *.egg-info
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)

# GPU kit (docs/gpu.md). Here: `make gpu-kit` downloads what a borrowed GPU machine lacks (wheels for its Python 3.12,
# the demo target's GGUF) into .gpu-kit/, cut into loads that fit one device call each, and prints the calls;
# `make gpu-plan` prints them again, checked against the working tree now. On the GPU machine (no .venv there:
# GPU_PYTHON is its image's python3, with torch): `make gpu-check` (setup + every GPU test) and `make gpu-bench`
# (timed stages, GPU_BENCH_ARGS="--stages slo" for a subset), results under $OUT. Back here:
# `make gpu-results FROM="<files_at of each call>"` unpacks them into bench/results/gpu-<run>-<device>/.
GPU_PYTHON ?= python3
GPU_BENCH_ARGS ?=
FROM ?=
.PHONY: gpu-kit gpu-plan gpu-check gpu-bench gpu-results

gpu-kit: setup
	$(PY) -m bench.gpu build

gpu-plan:
	$(PY) -m bench.gpu plan

gpu-check:
	PYTHONUNBUFFERED=1 $(GPU_PYTHON) -m bench.gpu check

gpu-bench:
	PYTHONUNBUFFERED=1 $(GPU_PYTHON) -m bench.gpu bench $(GPU_BENCH_ARGS)

gpu-results:
	$(PY) -m bench.gpu unpack $(FROM)
