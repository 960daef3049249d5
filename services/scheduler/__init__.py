"""The scheduler *service*: the public ``tandem.v1.Tandem`` endpoint over the iteration loop.

Not to be confused with the top-level ``scheduler/`` package, the scheduling core (the loop and the pure
policies) that this service runs: that package knows nothing of processes, sockets or storage.

    main.py          start()/serve(): wires workers, loop, observers, gRPC server
    servicer.py      Generate / GenerateUnary / Abort / Info
    translate.py     GenerateRequest -> Request, with the public endpoint's checks
    summary.py       Request -> GenerateSummary (finish reason, TTFT, TPOT, SLO, acceptance)
    text.py          tokenizer: text prompts, incremental detokenization
    ledger.py        per-request step facts (accepted per chunk, verify steps, admission time)
    policies.py      policies by configured name
    timebase.py      scheduler clock -> Unix ns
    errors.py        request errors with their gRPC status (shared/errors.py: the one hierarchy)
    grpc_workers.py  the loop's workers over gRPC: GrpcTargetWorker, GrpcDraftWorker
    observers/       Redis records, Prometheus metrics, request traces

The loop itself (scheduler/) stays free of grpc, redis and OpenTelemetry (tests/repo/test_layout.py);
everything that touches them lives here.
"""
