"""Configuration of one Tandem process (target, draft or scheduler), from arguments or TANDEM_* variables.

    settings = ServiceSettings.from_env(port=0)          # TANDEM_PORT etc., then explicit overrides
    settings.listen_address("target")                    # "127.0.0.1:50052" unless TANDEM_PORT says otherwise
    settings.model_path("target")                        # TANDEM_MODEL, else the pair's target under TANDEM_HOME

Environment names are the field names upper-cased behind the prefix: the
contract docker-compose.yml and deploy/README.md document (TANDEM_HOST,
TANDEM_PORT, TANDEM_SERVICE_NAME, TANDEM_TRACE_EXPORTER, TANDEM_OTLP_ENDPOINT,
TANDEM_HOME, TANDEM_PAIR, TANDEM_MODEL, TANDEM_DEVICE, TANDEM_DTYPE, TANDEM_VOCAB_SIZE, and for
the scheduler TANDEM_TARGET_ADDR, TANDEM_DRAFT_ADDR, TANDEM_REDIS_URL,
TANDEM_METRICS_PORT, TANDEM_QUEUE_POLICY, TANDEM_SPECULATION_POLICY,
TANDEM_TOKEN_BUDGET, TANDEM_PROFILE, TANDEM_FRONTIER, TANDEM_DRAFT_OFFLOAD; for the target
TANDEM_EARLY_EXIT, TANDEM_KV_GROW_BLOCKS; for the model services TANDEM_THREADS, TANDEM_NUM_BLOCKS,
TANDEM_BLOCK_SIZE, TANDEM_KV_CACHE_BYTES).
The environment is read when ``from_env`` is called, never at import.
An empty variable counts as unset, because compose writes
``TANDEM_MODEL: ${TANDEM_TARGET_MODEL:-}`` to mean "the pair's model".
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator

from scheduler.frontier import FrontierConfig
from shared.engine.config import EngineConfig
from shared.engine.early_exit import EarlyExitConfig
from shared.engine.errors import ModelLoadError
from shared.engine.suffix_drafter import SuffixConfig
from shared.rpc.tls import ClientTls, ServerTls, TlsConfigError
from shared.telemetry import ExporterKind, TracingConfig

Role = Literal["scheduler", "target", "draft"]

# Where each role listens when no port is configured (the ports docker-compose.yml uses).
DEFAULT_PORTS: dict[str, int] = {"scheduler": 50051, "target": 50052, "draft": 50053}

NGRAM = "ngram"  # the draft "model" that selects prompt lookup (shared/engine/ngram_drafter.py)
DEFAULT_NGRAM = (1, 4)


def parse_ngram_spec(spec: str | None) -> tuple[int, int] | None:
    """``"ngram"`` -> (1, 4), ``"ngram:2-5"`` -> (2, 5), ``"ngram:3"`` -> (3, 3); None for a model path or name.

    Raises ValueError for a malformed spec (``"ngram:"``, ``"ngram:4-1"``, ``"ngram:x"``), so a
    typo fails at startup instead of being looked up as a model directory.
    """
    if spec is None:
        return None
    spec = spec.strip()
    if spec == NGRAM:
        return DEFAULT_NGRAM
    if not spec.startswith(NGRAM + ":"):
        return None
    low, dash, high = spec[len(NGRAM) + 1 :].partition("-")
    if not (low.isdigit() and (high.isdigit() if dash else True)):
        raise ValueError(f"malformed n-gram draft {spec!r}: use ngram or ngram:MIN-MAX, e.g. ngram:1-4")
    min_ngram, max_ngram = int(low), int(high) if dash else int(low)
    if not 1 <= min_ngram <= max_ngram:
        raise ValueError(f"malformed n-gram draft {spec!r}: need 1 <= MIN <= MAX")
    return min_ngram, max_ngram


SUFFIX = "suffix"  # the draft "model" that selects suffix-tree drafting (shared/engine/suffix_drafter.py)


def parse_suffix_spec(spec: str | None) -> SuffixConfig | None:
    """``"suffix"`` -> the defaults, ``"suffix:max_depth=32,alpha=2"`` -> those set; None for a model path or name.

    Keys are SuffixConfig's fields (max_depth, max_match, alpha, min_prob, global_tokens). Raises ValueError
    for a malformed spec (``"suffix:"``, an unknown key, a value out of range), so a typo fails at startup.
    """
    if spec is None:
        return None
    spec = spec.strip()
    if spec == SUFFIX:
        return SuffixConfig()
    if not spec.startswith(SUFFIX + ":"):
        return None
    usage = f"use suffix or suffix:KEY=VALUE,... with keys {', '.join(SuffixConfig.model_fields)}"
    fields: dict[str, str] = {}
    for part in spec[len(SUFFIX) + 1 :].split(","):
        key, eq, value = (x.strip() for x in part.partition("="))
        if not eq or not value:
            raise ValueError(f"malformed suffix draft {spec!r}: {part.strip()!r} is not KEY=VALUE; {usage}")
        if key not in SuffixConfig.model_fields:
            raise ValueError(f"malformed suffix draft {spec!r}: unknown key {key!r}; {usage}")
        if key in fields:
            raise ValueError(f"malformed suffix draft {spec!r}: {key} is given twice")
        fields[key] = value
    try:
        return SuffixConfig(**fields)
    except ValidationError as exc:
        problems = "; ".join(
            ": ".join([*map(str, e["loc"]), e["msg"].removeprefix("Value error, ")]) for e in exc.errors()
        )
        raise ValueError(f"malformed suffix draft {spec!r}: {problems}") from None


def suffix_name(config: SuffixConfig) -> str:
    """The model name the draft service reports: ``suffix(max_depth=24,max_match=12,alpha=2,...)``."""
    values = (f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in config.model_dump().items())
    return f"{SUFFIX}({','.join(values)})"


def is_model_free(spec: str | None) -> bool:
    """Whether ``spec`` names a model-free draft (ngram or suffix); raises ValueError when it is malformed."""
    return parse_ngram_spec(spec) is not None or parse_suffix_spec(spec) is not None


def parse_early_exit(spec: str | None) -> EarlyExitConfig | None:
    """``on`` / ``on:k_init=16,gate=false`` -> EarlyExitConfig; unset, empty or ``off`` -> None."""
    if spec is None or spec.strip().lower() in ("", "off", "false", "0", "none"):
        return None
    head, _, rest = spec.strip().partition(":")
    if head.lower() not in ("on", "true", "1"):
        raise ValueError(f"early exit {spec!r}: use off, on or on:FIELD=VALUE,...")
    fields: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = part.partition("=")
        if not eq or key.strip() not in EarlyExitConfig.model_fields:
            raise ValueError(f"early exit {spec!r}: {part!r} is not FIELD=VALUE of {sorted(EarlyExitConfig.model_fields)}")
        fields[key.strip()] = value.strip()
    return EarlyExitConfig(enabled=True, **fields)


# TANDEM_FRONTIER keys -> FrontierConfig fields
_FRONTIER_KEYS = {"chunk": "chunk_size", "max_chunk": "max_chunk", "alpha": "alpha", "min_gain": "min_gain",
                  "gain": "require_gain", "measured": "measured"}  # fmt: skip


def parse_frontier(spec: str | None) -> FrontierConfig | None:
    """TANDEM_FRONTIER: ``off`` (None), ``on`` (s_c from the cost models), or ``chunk=2[,min_gain=0.1,...]``.

    Keys: chunk (s_c; with no cost models it is used as is, so the step always pipelines), max_chunk,
    alpha, min_gain, gain (false = pipeline even when the cost models predict no gain), measured (false = no
    check against both modes' measured token rates, scheduler/frontier_gate.py). ``on:KEYS``
    is the same as ``KEYS``.
    """
    text = (spec or "").strip().lower()
    if text in ("", "off", "false", "0", "none", "no"):
        return None
    head, colon, rest = text.partition(":")
    if head in ("on", "true", "1", "yes"):
        text = rest if colon else ""
    fields: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, eq, value = part.partition("=")
        if not eq or key.strip() not in _FRONTIER_KEYS:
            raise ValueError(f"frontier {spec!r}: use off, on, or {','.join(k + '=' for k in _FRONTIER_KEYS)}...")
        fields[_FRONTIER_KEYS[key.strip()]] = value.strip()
    return FrontierConfig(**fields)


def ngram_name(min_ngram: int, max_ngram: int) -> str:
    """The canonical spec, which is also the model name the draft service reports: ``ngram:1-4``."""
    return f"{NGRAM}:{min_ngram}-{max_ngram}"


class ServiceSettings(BaseModel):
    """Everything a Tandem process reads from its environment; every field has a default."""

    # --- serving ------------------------------------------------------------------------------
    host: str = Field("127.0.0.1", description="Interface to listen on (0.0.0.0 in containers).")
    port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="Port to listen on; unset = the role's default (50051/50052/50053); 0 = any free port.",
    )
    service_name: str | None = Field(None, description="service.name of traces and logs; unset = the role.")
    log_level: str = Field("info", description="Python logging level name.")
    shutdown_grace_s: float = Field(5.0, ge=0, description="Seconds in-flight calls get to finish on shutdown.")

    # --- tracing ------------------------------------------------------------------------------
    trace_exporter: ExporterKind = Field(
        "none", description="otlp (to otlp_endpoint), console, memory (tests) or none."
    )
    otlp_endpoint: str | None = Field(None, description="OTLP/gRPC endpoint, e.g. http://jaeger:4317.")

    # --- model (target and draft services) ----------------------------------------------------
    home: Path | None = Field(
        None, description="Tandem home with models/<name>/; unset = $TANDEM_HOME or ~/.cache/tandem."
    )
    pair: str = Field("demo", description="Model pair whose target/draft is served when `model` is unset.")
    model: str | None = Field(
        None,
        description="Model to serve: a directory or .gguf path, a model name under <home>/models, "
        "or a role of the pair (target, draft); unset = the pair's model for this service's role. "
        "The draft service also takes model-free drafts, no weights: ngram or ngram:MIN-MAX (prompt lookup), "
        "suffix or suffix:KEY=VALUE,... (suffix-tree drafting; keys max_depth, max_match, alpha, min_prob, "
        "global_tokens).",
    )
    target_model: str | None = Field(
        None,
        description="Draft service with an EAGLE-3 head that carries no token embedding (published heads): the "
        "target model (path or name) to take it from; unset = the pair's target.",
    )
    feature_dtype: str = Field(
        "float16",
        description="Feature-level drafts: the dtype target features travel in (float16, bfloat16, float32).",
    )
    vocab_size: int | None = Field(
        None,
        ge=1,
        description="The target's vocabulary size, for a model-free draft (ngram, suffix: no model to read it from) "
        "to refuse out-of-range token ids as a model draft does; unset = token ids are not checked there.",
    )
    device: str = Field("auto", description="auto (CUDA when available, else CPU), cpu, cuda, cuda:N.")
    dtype: str = Field("auto", description="auto (bfloat16 on CUDA, float32 on CPU), float32, bfloat16, float16.")
    block_size: int | None = Field(None, ge=1, description="KV cache block size in tokens; unset = the engine default.")
    num_blocks: int | None = Field(None, ge=1, description="KV cache blocks; unset = sized from kv_cache_bytes.")
    kv_cache_bytes: int | None = Field(
        None, ge=1, description="KV cache memory when num_blocks is unset; unset = the engine default."
    )
    kv_grow_blocks: int = Field(
        0,
        ge=0,
        description="Target: KV blocks the pool may add while the co-located draft is offloaded (Nightjar elastic "
        "memory, TANDEM_DRAFT_OFFLOAD on the scheduler): what the draft's weights and KV pool are worth in target "
        "blocks; 0 = the pool keeps its start-up size.",
    )
    cpu_prepack: bool = Field(
        True,
        description="Target and draft on CPU (float32): prepack the weights for oneDNN, used by forwards of a few "
        "token rows on (faster than MKL there; doubles the weights' memory); off = plain F.linear.",
    )
    cpu_prepack_min_rows: int | None = Field(
        None,
        ge=1,
        description="Row count from which the prepacked weights are used; unset = measured at load on this CPU.",
    )
    attention_backend: Literal["auto", "sdpa", "flashinfer"] = Field(
        "auto",
        description="Target and draft: attention kernels; auto = flashinfer on CUDA when it is installed, else "
        "PyTorch SDPA. sdpa on a GPU skips flashinfer's JIT compile (minutes on a fresh machine).",
    )

    api_keys: SecretStr | None = Field(
        None, description="Scheduler: API keys the public endpoint accepts (comma-separated; clients send "
        "'authorization: Bearer <key>'); unset with no file = the endpoint is open."
    )
    api_keys_file: Path | None = Field(None, description="Scheduler: file of API keys, one per line (# comments).")
    tls_cert: Path | None = Field(None, description="Scheduler: PEM certificate chain; with tls_key the public "
                                  "endpoint speaks TLS.")
    tls_key: Path | None = Field(None, description="Scheduler: PEM private key of tls_cert.")
    internal_tls_cert: Path | None = Field(
        None, description="Model services: PEM certificate chain they serve (with internal_tls_key: TLS between the "
        "scheduler and them). Scheduler: its client certificate (mutual TLS)."
    )
    internal_tls_key: Path | None = Field(None, description="PEM private key of internal_tls_cert.")
    internal_tls_ca: Path | None = Field(
        None, description="Scheduler: CA bundle the model services' certificates must chain to; set = it dials them "
        "over TLS. Model services: set = clients must present a certificate it signed (mutual TLS)."
    )
    internal_tls_server_name: str | None = Field(
        None, description="Scheduler: the name the model services' certificates must carry, instead of the host dialled."
    )
    internal_secret: SecretStr | None = Field(
        None,
        description="Shared secret between the scheduler and the model services (metadata x-tandem-secret); "
        "a model service refuses calls without it (UNAUTHENTICATED). Unset = no check. `tandem up` sets a random one.",
    )
    internal_secret_file: Path | None = Field(None, description="File whose first line is the internal secret.")

    # --- scheduler ----------------------------------------------------------------------------
    target_addr: str = Field("127.0.0.1:50052", description="host:port of the target service.")
    draft_addr: str | None = Field(
        "127.0.0.1:50053",
        description="host:port of the draft service; 'none' = no draft (every request decodes plainly).",
    )
    redis_url: str | None = Field(
        None, description="Redis URL for request state and statistics; unset = start a local one."
    )
    http_port: int | None = Field(
        None, ge=0, le=65535, description="Scheduler: port of the OpenAI-compatible HTTP API (/v1/completions, "
        "/v1/chat/completions, /v1/models, /health); unset = none; 0 = any free port."
    )
    metrics_port: int | None = Field(
        None, ge=0, le=65535, description="Port of the Prometheus /metrics endpoint; unset = none."
    )
    queue_policy: str = Field(
        "fcfs", description="Request order policy of the scheduler: fcfs, las[:Q], lp-sjf, laps-sd[:OPTS]."
    )
    max_batch_size: int = Field(64, ge=1, description="Most requests the scheduler runs (verifies) at once.")
    max_queue: int = Field(
        1024, ge=1, description="Most requests waiting for a batch slot; past it Generate answers RESOURCE_EXHAUSTED "
        "with a retry hint (trailing metadata grpc-retry-pushback-ms)."
    )
    target_recovery_s: float = Field(
        60.0, ge=0.0, description="How long in-flight requests wait for a target that died or restarted (then "
        "re-prefilled with what they committed; greedy output unchanged) before ending UNAVAILABLE; 0 = fail at once."
    )
    max_prompt_bytes: int = Field(1 << 20, ge=1, description="Longest prompt text (UTF-8 bytes) one request may send.")
    max_prompt_tokens: int | None = Field(
        None, ge=1, description="Most prompt tokens per request; unset = the target's context window."
    )
    max_new_tokens: int | None = Field(
        None, ge=1, description="Cap on max_new_tokens per request; unset = the target's context window."
    )
    max_stop_strings: int = Field(16, ge=0, description="Most stop strings per request.")
    max_stop_chars: int = Field(256, ge=1, description="Longest stop string (characters).")
    max_stop_token_ids: int = Field(64, ge=0, description="Most stop token ids per request.")
    speculation_policy: str = Field(
        "fixed", description="Speculation policy for requests in AUTO mode (fixed[:K], none, ...)."
    )
    draft_offload: str = Field(
        "off",
        description="Nightjar elastic draft memory: off, on, or low=0.1,high=0.3,persist=8 (τ_low, τ_high as free "
        "shares of the KV budget, T_persist steps); offloads the draft while nothing speculates under KV pressure.",
    )
    token_budget: int | None = Field(
        None,
        ge=1,
        description="Verify tokens per target forward (AdaServe's B) for the tree policies; unset = the target's "
        "profile (`tandem profile`), else the policies' default.",
    )
    profile: Path | None = Field(
        None,
        description="Profile file of the target (B, cost model); unset = the newest under "
        "<home>/profiles/<target model>/, else the Redis blob profile:<target model>.",
    )
    frontier: str = Field(
        "off",
        description="Scheduler: frontier pipelining (FASER §4.3): off, on (chunk size s_c from the draft and "
        "target cost models, only when they predict a gain), or chunk=N[,max_chunk=,alpha=,min_gain=,gain=false].",
    )
    worker_protocol: Literal["stream", "unary"] = Field(
        "stream",
        description="Scheduler: how it drives the model services: stream (one long-lived step stream per "
        "service, one message per step; docs/services.md) or unary (one RPC per call, the older protocol).",
    )
    plan_repeat: int = Field(
        3, ge=0, le=4,
        description="Scheduler over step streams: where the next steps are known when a plan leaves (decode "
        "run-ahead; relayed verify run-ahead under a fixed policy), the plan asks the target to run up to this many "
        "more by itself (services/target/repeat_plan.py): fewer plan messages and no round trip between those steps; "
        "a request that ends meanwhile is decoded or verified that many times more for nothing. How many, from 1 "
        "up, follows the step time (repeat_wait_ms).",
    )  # fmt: skip
    repeat_wait_ms: float = Field(
        4.0, ge=0.0,
        description="Scheduler over step streams: the most an arrival should wait for steps already asked of the "
        "target (2R + 1 of them at R continuation steps per plan): R is the largest, up to plan_repeat and at least "
        "1, with (2R + 1) steps of the measured step time within it (scheduler/step_pace.py).",
    )  # fmt: skip
    run_ahead: bool = Field(
        True,
        description="Scheduler without a draft, over step streams: send each plain-decode step's plan as soon as "
        "the last outcome is in, so the target's forward runs beside the scheduler's commit (run_ahead.py).",
    )
    draft_ahead: bool = Field(
        True,
        description="Scheduler with a plain draft, over step streams: send each request's next speculate as soon "
        "as the target's outcome is in, so the draft drafts while the scheduler commits (draft_ahead.py).",
    )
    draft_relay: bool = Field(
        True,
        description="Scheduler with a plain draft, over step streams, verifying every drafted node: the target "
        "hands each step's committed tokens straight to the draft at draft_addr and the draft's next trees go "
        "straight back to it, so a speculative step crosses two hops, not four (scheduler/draft_relay.py); "
        "where it is off or cannot apply, draft_ahead.",
    )
    relay_lookahead: Literal["measured", "always", "off"] = Field(
        "measured",
        description="Target, draft relay: with each answer the draft also drafts the tree after the next one on its "
        "optimistic prefix (that tree's first-child path accepted, the bonus token guessed); a step that commits "
        "exactly that prefix verifies it without waiting for the draft (services/draft/relay_lookahead.py). "
        "measured: where steps measure faster per token with it than without, per batch size, and while at least "
        "one in ten is taken; always: every handoff; off: never.",
    )
    relay_transport: Literal["socket", "grpc"] = Field(
        "socket",
        description="Target, draft relay: socket (the draft's relay socket, a plain framed TCP connection that Info "
        "reports, services/draft/relay_socket.py; gRPC where the draft serves none or it does not answer) or grpc "
        "(the DraftService/Relay stream).",
    )
    relay_socket: bool = Field(
        True,
        description="Draft: serve the relay on a framed TCP socket beside gRPC (over internal TLS too, from the same "
        "files): the same handoffs and answers without gRPC's per-message cost.",
    )
    relay_socket_port: int = Field(
        0, ge=0, le=65535,
        description="Draft: the relay socket's port; 0 = any free one (Info reports it). Name one where only "
        "declared ports are reachable (a Kubernetes Service).",
    )
    outcome_hold_ms: float = Field(
        2.0, ge=0.0, le=100.0,
        description="Target, step streams: a continuation step that took under this long, with three more owed, "
        "holds its outcome for the next step's, and both leave as one message (services/target/outcome_hold.py): "
        "less CPU per step where steps are short, each held outcome's tokens one step later; 0: every outcome "
        "leaves at once.",
    )  # fmt: skip
    feature_path: Literal["direct", "relay"] = Field(
        "direct",
        description="Scheduler, feature-level drafts over step streams: direct (the target pushes each step's "
        "feature rows to the draft at draft_addr; the scheduler moves positions only) or relay (through the scheduler).",
    )
    feature_shared_memory: bool = Field(
        True,
        description="Target, feature rows pushed straight to a draft on the same host (the same /dev/shm): through a "
        "shared-memory ring, the push carrying positions only (shared/rpc/shared_rows.py); false: over gRPC.",
    )
    threads: int | None = Field(
        None,
        ge=1,
        description="Model services: torch intra-op threads (torch.set_num_threads) for this process; unset = "
        "torch's default. The launcher's thread split (FASER §4.4 CPU fallback) sets it per service.",
    )
    early_exit: str | None = Field(
        None,
        description="Target: token-wise early exit (FASER §4.2): unset/off, on, or on:FIELD=VALUE,... with "
        "EarlyExitConfig fields (init_layer, check_every, k_init, k_final, gate, inline_check).",
    )

    @field_validator("early_exit")
    @classmethod
    def _check_early_exit(cls, spec: str | None) -> str | None:
        parse_early_exit(spec)  # a malformed spec fails when the process reads its settings
        return spec

    def early_exit_config(self) -> EarlyExitConfig | None:
        return parse_early_exit(self.early_exit)

    @field_validator("frontier")
    @classmethod
    def _check_frontier(cls, spec: str) -> str:
        parse_frontier(spec)
        return spec

    def frontier_config(self) -> FrontierConfig | None:
        return parse_frontier(self.frontier)

    @field_validator("model")
    @classmethod
    def _check_model_free_spec(cls, model: str | None) -> str | None:
        is_model_free(model)  # a malformed ngram:... or suffix:... fails here, when the process reads its settings
        return model

    @classmethod
    def from_env(
        cls, prefix: str = "TANDEM_", env: Mapping[str, str] | None = None, **overrides: Any
    ) -> ServiceSettings:
        """Fields from ``env`` (default ``os.environ``) named PREFIX + FIELD; ``overrides`` win.

        Raises pydantic.ValidationError naming the variable's field when a value does not parse.
        """
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for name in cls.model_fields:
            raw = env.get(prefix + name.upper())
            if raw is not None and raw.strip() != "":
                values[name] = raw.strip()
        values.update(overrides)
        return cls.model_validate(values)

    # --- derived ------------------------------------------------------------------------------
    def api_key_set(self) -> frozenset[str]:
        from shared.rpc.api_keys import load_keys

        value = self.api_keys.get_secret_value() if self.api_keys is not None else None
        return load_keys(value, self.api_keys_file)

    def public_tls(self) -> ServerTls | None:
        """The public endpoint's TLS (tls_cert + tls_key), or None: plaintext."""
        return ServerTls.from_files(self.tls_cert, self.tls_key, None, "TANDEM_TLS")

    def internal_server_tls(self) -> ServerTls | None:
        """A model service's TLS (internal_tls_cert + key; mutual with internal_tls_ca), or None: plaintext."""
        return ServerTls.from_files(self.internal_tls_cert, self.internal_tls_key, self.internal_tls_ca,
                                    "TANDEM_INTERNAL_TLS")

    def internal_client_tls(self) -> ClientTls | None:
        """How the scheduler dials the model services: TLS when internal_tls_ca is set (with its client
        certificate when internal_tls_cert is set too), else None: plaintext."""
        if self.internal_tls_ca is None:
            if self.internal_tls_cert is not None:
                raise TlsConfigError("TANDEM_INTERNAL_TLS_CERT is set on the scheduler without TANDEM_INTERNAL_TLS_CA, "
                                     "the CA of the model services' certificates")
            return None
        return ClientTls(ca=self.internal_tls_ca, cert=self.internal_tls_cert, key=self.internal_tls_key,
                         server_name=self.internal_tls_server_name)

    def secret(self) -> str | None:
        """The internal secret (from the value or the file), or None when unset."""
        from shared.rpc.shared_secret import load_secret

        value = self.internal_secret.get_secret_value() if self.internal_secret is not None else None
        return load_secret(value, self.internal_secret_file)

    def name_for(self, role: Role) -> str:
        return self.service_name or role

    def port_for(self, role: Role) -> int:
        return DEFAULT_PORTS[role] if self.port is None else self.port

    def listen_address(self, role: Role) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host  # IPv6 literals need brackets
        return f"{host}:{self.port_for(role)}"

    def tracing(self, role: Role) -> TracingConfig:
        return TracingConfig(
            service_name=self.name_for(role), exporter=self.trace_exporter, endpoint=self.otlp_endpoint
        )

    def engine_config(self) -> EngineConfig:
        """EngineConfig with the KV cache fields that are set here; the engine's defaults for the rest."""
        fields = {"block_size": self.block_size, "num_blocks": self.num_blocks, "kv_cache_bytes": self.kv_cache_bytes}
        return EngineConfig(
            kv_grow_blocks=self.kv_grow_blocks, cpu_prepack=self.cpu_prepack,
            cpu_prepack_min_rows=self.cpu_prepack_min_rows, attention_backend=self.attention_backend,
            graph_warmup=True,  # a service captures its common CUDA graphs before it serves (GPU only)
            **{k: v for k, v in fields.items() if v is not None}
        )

    def ngram(self, role: Literal["target", "draft"]) -> tuple[int, int] | None:
        """(min_ngram, max_ngram) when ``model`` selects the model-free n-gram draft, else None.

        Raises ModelLoadError when it does so for the target: prompt lookup only drafts.
        """
        sizes = parse_ngram_spec(self.model)
        if sizes is not None and role != "draft":
            raise ModelLoadError(f"{self.model!r} is a model-free draft; the {role} service needs a model")
        return sizes

    def suffix(self, role: Literal["target", "draft"]) -> SuffixConfig | None:
        """The SuffixConfig when ``model`` selects the model-free suffix-tree draft, else None.

        Raises ModelLoadError when it does so for the target: suffix trees only draft.
        """
        config = parse_suffix_spec(self.model)
        if config is not None and role != "draft":
            raise ModelLoadError(f"{self.model!r} is a model-free draft; the {role} service needs a model")
        return config

    def model_path(self, role: Literal["target", "draft"]) -> Path:
        """The model directory or .gguf this role serves; raises ModelLoadError naming what was tried.

        ``model`` is tried as a path, then as a model name under <home>/models,
        then as a role of ``pair``; unset means the pair's model for ``role``.
        """
        from shared.models.paths import Paths
        from shared.models.registry import get_pair

        if self.ngram(role) is not None or self.suffix(role) is not None:
            raise ModelLoadError(f"{self.model!r} is model-free: it has no model path")
        paths = Paths.resolve(self.home)
        spec = self.model or role
        if spec in ("target", "draft"):
            try:
                pair = get_pair(self.pair)
            except ValueError as exc:
                raise ModelLoadError(str(exc)) from None
            path = paths.model_dir((pair.target if spec == "target" else pair.draft).name)
            if not path.exists():
                raise ModelLoadError(
                    f"the {spec} model of pair {pair.name!r} is not prepared at {path}; "
                    f"run `tandem models prepare --pair {pair.name}` or set TANDEM_MODEL"
                )
            return path
        candidates = [Path(spec).expanduser(), paths.model_dir(spec), paths.home / spec]
        for path in candidates:
            if path.exists():
                return path
        tried = ", ".join(str(p) for p in candidates)
        raise ModelLoadError(f"model {spec!r} not found (tried {tried})")
