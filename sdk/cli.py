"""The `tandem` command.

    tandem up [--pair demo|tiny]          Redis + target + draft + scheduler on loopback, until Ctrl-C
    tandem up --draft-model ngram         ... with model-free prompt lookup as the draft
    tandem up --draft-model suffix        ... with model-free suffix-tree drafting (suffix:alpha=2,... for options)
    tandem up --target-model DIR --draft-model DIR   your own pair (docs/models.md#your-own-pair)
    tandem serve target|draft|scheduler   one service, configured by TANDEM_* variables (what compose runs)
    tandem generate "What is the capital of France?" --max-new-tokens 32 --spec 4 --slo-tpot-ms 50
                                          (in the model's chat template when it has one; --raw: as it is;
                                          --temperature --top-p --top-k --min-p --repetition-penalty --seed,
                                          --logprobs N: each token's log-probability and N alternatives)
    tandem chat [--system "..."]          an interactive conversation, streamed, stats after each answer
    tandem status                         the scheduler's Info and health
    tandem --version
    tandem models list|prepare|check      model pairs (shared.models.cli)
    tandem profile [--pair tiny --quick]  verify cost of the target: budget B, cost model (shared.profiling.cli)
    tandem profile --shares               draft and target latency per share of the machine (FASER §4.4)

Heavy imports (torch, the services) happen inside the commands, so
`tandem generate` and `tandem status` start fast.
"""

from __future__ import annotations

from shared.omp_wait import apply_defaults

apply_defaults()  # before any command loads torch: profile, simulate and the models run as the services do

import signal
import sys
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from sdk.chat_cli import chat
from sdk.cli_options import (
    DEFAULT_ADDR, AddrOption, CaOption, MinPOption, RepetitionPenaltyOption, SeedOption, TlsOption, TopKOption,
    client_tls, SloTpotOption, SloTtftOption, SpecOption, SystemOption, TemperatureOption, TopPOption, sampling_args,
)  # fmt: skip
from shared.models.cli import app as models_app
from shared.profiling.cli import profile

app = typer.Typer(help="Tandem: LLM serving with SLO-aware speculative decoding.", no_args_is_help=True)
app.add_typer(models_app, name="models")
app.command()(profile)



def _print_version(value: bool) -> None:
    if value:
        from services.version import service_version

        typer.echo(f"tandem {service_version()}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_print_version,
                                          help="Print Tandem's version and exit.")] = False,  # fmt: skip
) -> None:
    """Tandem: LLM serving with SLO-aware speculative decoding."""


TlsCertOption = Annotated[Path | None, typer.Option(help="Public endpoint over TLS: PEM certificate chain "
                                                    "(default $TANDEM_TLS_CERT).")]
TlsKeyOption = Annotated[Path | None, typer.Option(help="PEM private key of --tls-cert (default $TANDEM_TLS_KEY).")]
TlsCaOption = Annotated[Path | None, typer.Option(help="CA of --tls-cert when it is not self-signed.")]
InternalCertOption = Annotated[Path | None, typer.Option(help="TLS between scheduler and model services: the "
                                                         "certificate they serve (default $TANDEM_INTERNAL_TLS_CERT).")]
InternalKeyOption = Annotated[Path | None, typer.Option(help="PEM private key of --internal-tls-cert.")]
InternalCaOption = Annotated[Path | None, typer.Option(help="CA of --internal-tls-cert (default: the certificate "
                                                       "itself).")]
InternalMtlsOption = Annotated[bool, typer.Option(help="Mutual TLS inside: the model services require the "
                                                  "scheduler's client certificate (--internal-tls-cert).")]

app.command()(chat)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True}, add_help_option=False)
def simulate(ctx: typer.Context) -> None:
    """Serving on a virtual clock (bench.simulate): run, fidelity, gpu; `tandem simulate --help` for each."""
    from bench.simulate.cli import app as simulate_app  # the benches sit above the SDK: imported only when asked

    simulate_app(args=ctx.args, prog_name="tandem simulate")

class Role(StrEnum):
    target = "target"
    draft = "draft"
    scheduler = "scheduler"


@app.command()
def serve(role: Annotated[Role, typer.Argument(help="Which service to run.")]) -> None:
    """Run one service until SIGTERM/SIGINT, configured by TANDEM_* environment variables."""
    import logging

    from services.settings import ServiceSettings

    from shared.engine.errors import ModelLoadError
    from shared.event_loop import run_loop

    settings = _settings_or_exit(role)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        if role is Role.scheduler:
            from services.scheduler.main import serve as serve_scheduler

            run_loop(serve_scheduler(settings))
        else:
            from services.model_main import serve as serve_model

            run_loop(serve_model(settings, role.value))
    except ModelLoadError as exc:  # a model the settings name that cannot be served: a setting, not a crash
        _bad_setting(role, str(exc))


def _settings_or_exit(role: Role):
    """ServiceSettings from TANDEM_* variables; a value that does not parse ends the command with one line, exit 2."""
    from pydantic import ValidationError

    from services.settings import ServiceSettings

    try:
        settings = ServiceSettings.from_env()
        if role is Role.scheduler:  # its policies by name: checked before it waits for the model services
            from services.scheduler.policies import queue_policy, speculation_policy

            speculation_policy(settings.speculation_policy)
            queue_policy(settings.queue_policy)
    except ValidationError as exc:
        _bad_setting(role, "; ".join(_setting_problem(err) for err in exc.errors(include_url=False)))
    except ValueError as exc:
        _bad_setting(role, str(exc))
    return settings


def _setting_problem(err: dict) -> str:
    """One pydantic error as the variable that caused it: ``TANDEM_PORT='abc': Input should be a valid integer``."""
    field = str(err["loc"][0]) if err.get("loc") else ""
    name = f"TANDEM_{field.upper()}" if field else "settings"
    given = f"={err['input']!r}" if field and isinstance(err.get("input"), str | int | float) else ""
    return f"{name}{given}: {err['msg']}"


def _bad_setting(role: Role, message: str) -> None:
    typer.echo(f"tandem serve {role.value}: {' '.join(message.split())}", err=True)
    raise typer.Exit(2)


@app.command()
def up(
    pair: Annotated[str, typer.Option(help="Model pair (tandem models list).")] = "demo",
    port: Annotated[int, typer.Option(help="Public port of the scheduler.")] = 50051,
    metrics_port: Annotated[int, typer.Option(help="Prometheus /metrics port; 0 = any free port.")] = 9400,
    http_port: Annotated[int | None, typer.Option(help="OpenAI-compatible HTTP API port (/v1/...); 0 = any free "
                                                  "port; unset = none.")] = None,
    redis_url: Annotated[
        str | None,
        typer.Option(envvar=["TANDEM_REDIS_URL", "REDIS_URL"], help="Redis to use; unset = start a local one."),
    ] = None,
    speculation_policy: Annotated[
        str,
        typer.Option(
            help="Policy for AUTO requests: fixed[:K], none, adaserve, global_greedy, equal_greedy, specinfer[:E]."
        ),
    ] = "fixed",
    draft: Annotated[bool, typer.Option(help="Run the draft service (when its model is prepared).")] = True,
    target_model: Annotated[
        str | None,
        typer.Option(help="Your own target: an HF directory (config.json + safetensors) or a .gguf of the Llama, "
                     "Qwen2, Qwen3 or Mistral families; unset = the pair's (docs/models.md#your-own-pair)."),
    ] = None,
    draft_model: Annotated[
        str | None,
        typer.Option(help="Draft model path or name, or a model-free draft: ngram[:MIN-MAX] (prompt lookup) or "
                     "suffix[:KEY=VALUE,...] (suffix trees; keys max_depth, max_match, alpha, min_prob, "
                     "global_tokens); unset = the pair's."),
    ] = None,
    home: Annotated[Path | None, typer.Option(help="Tandem home (default $TANDEM_HOME or ~/.cache/tandem).")] = None,
    device: Annotated[str, typer.Option(help="Device of the model services.")] = "auto",
    dtype: Annotated[str, typer.Option(help="Weights of the model services: auto (float32 on CPU, bfloat16 on CUDA), "
                                       "float32, bfloat16 (on CPUs with native bf16, AVX512-BF16/AMX: lossless, and "
                                       "verifying k tokens costs about one decode; docs/engine.md), float16.")] = "auto",
    log_dir: Annotated[Path | None, typer.Option(help="Directory for the services' logs.")] = None,
    draft_share: Annotated[
        str | None,
        typer.Option(help="Draft's share r of the machine (FASER §4.4): CPU threads split r : 1-r; on CUDA MPS "
                     "active-thread percentages (needs the MPS daemon). 'auto': from `tandem profile --shares`."),
    ] = None,
    share_batch: Annotated[int, typer.Option(help="--draft-share auto: the batch size r is chosen for.")] = 1,
    share_chunk: Annotated[int, typer.Option(help="--draft-share auto: the frontier chunk r is chosen for.")] = 2,
    draft_threads: Annotated[int | None, typer.Option(help="torch threads of the draft process.")] = None,
    target_threads: Annotated[int | None, typer.Option(help="torch threads of the target process.")] = None,
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
    tls_ca: TlsCaOption = None,
    internal_tls_cert: InternalCertOption = None,
    internal_tls_key: InternalKeyOption = None,
    internal_tls_ca: InternalCaOption = None,
    internal_mtls: InternalMtlsOption = False,
) -> None:
    """Start Redis (unless REDIS_URL is set), target, draft and scheduler on loopback; Ctrl-C stops all."""
    from services.launcher import LaunchConfig, LaunchError, launch

    from pydantic import ValidationError

    console = Console()
    try:
        config = LaunchConfig(
            pair=pair, port=port, metrics_port=metrics_port, http_port=http_port, redis_url=redis_url,
            speculation_policy=speculation_policy, draft=draft, target_model=target_model, draft_model=draft_model,
            home=home, device=device, dtype=dtype,
            log_dir=log_dir, draft_share=draft_share, share_batch=share_batch, share_chunk=share_chunk,
            draft_threads=draft_threads, target_threads=target_threads,
            **_launch_tls(tls_cert, tls_key, tls_ca, internal_tls_cert, internal_tls_key, internal_tls_ca, internal_mtls),
        )  # fmt: skip
    except ValidationError as exc:
        console.print(f"[red]invalid option:[/] {exc}")
        raise typer.Exit(2) from None
    signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops the stack as cleanly as Ctrl-C
    console.print(f"starting Tandem ({pair} pair) ...")
    try:
        with launch(config) as stack:
            _print_endpoints(console, stack.endpoints)
            _print_tls(console, stack)
            if stack.share is not None:
                console.print(f"draft share r = {stack.share['draft_share']:.3f} ({stack.share['source']}): "
                              f"{stack.share['env']}")  # fmt: skip
            while (died := stack.poll()) is None:
                time.sleep(0.5)
            console.print(f"[red]{died} exited[/]; stopping (logs in {stack.endpoints.log_dir})")
            raise typer.Exit(1)
    except LaunchError as exc:
        console.print(f"[red]launch failed:[/] {exc}")
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        console.print("stopped")


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def _print_endpoints(console: Console, e) -> None:
    table = Table(title="Tandem is up", show_header=False)
    table.add_row("public gRPC (scheduler)", e.scheduler)
    table.add_row("target", e.target)
    table.add_row("draft", e.draft or "[yellow]none (no speculation)[/]")
    table.add_row("redis", e.redis_url)
    table.add_row("metrics", e.metrics_url or "-")
    table.add_row("HTTP (OpenAI-compatible)", f"{e.http_url}/v1" if e.http_url else "-")
    table.add_row("logs", str(e.log_dir))
    console.print(table)
    console.print(f'try:  tandem generate "What is the capital of France?" --addr {e.scheduler}\n'
                  f'      tandem chat --addr {e.scheduler}     (Ctrl-C stops everything)')


@app.command()
def generate(
    prompt: Annotated[str, typer.Argument(help='Prompt text, or token ids with --ids ("1,2,3").')],
    addr: AddrOption = DEFAULT_ADDR,
    ids: Annotated[bool, typer.Option("--ids", help="PROMPT is comma-separated token ids.")] = False,
    raw: Annotated[bool, typer.Option("--raw", help="Send the text as it is, without the model's chat template.")] = False,
    system: SystemOption = None,
    max_new_tokens: Annotated[int, typer.Option(help="Tokens to generate at most.")] = 64,
    spec: SpecOption = "auto",
    slo_tpot_ms: SloTpotOption = None,
    slo_ttft_ms: SloTtftOption = None,
    temperature: TemperatureOption = 0.0,
    top_p: TopPOption = 1.0,
    seed: SeedOption = None,
    top_k: TopKOption = 0,
    min_p: MinPOption = 0.0,
    repetition_penalty: RepetitionPenaltyOption = 1.0,
    logprobs: Annotated[int | None, typer.Option(help="Print each token's log-probability and this many "
                                                 "alternatives (0-20) to stderr after the text.")] = None,
    stop: Annotated[list[str] | None, typer.Option(help="Stop string (repeatable).")] = None,
    priority: Annotated[int, typer.Option(help="Higher runs earlier.")] = 0,
    tls: TlsOption = False,
    ca: CaOption = None,
) -> None:
    """Stream one generation to stdout; its summary goes to stderr. The prompt is a user message in the
    model's chat template when the model has one (--system adds a system message); --raw sends it as is."""
    from sdk.chat_cli import prompt_for
    from sdk.client import Client
    from sdk.errors import TandemError
    from sdk.stats_line import logprobs_table, stats_line

    err = Console(stderr=True)
    try:
        prompt_arg = [int(t) for t in prompt.split(",")] if ids else prompt
        speculation = int(spec) if spec.isdigit() else spec
    except ValueError:
        raise typer.BadParameter("--ids needs comma-separated integers; --spec auto, off or an integer") from None
    try:
        with Client(addr, **client_tls(tls, ca)) as client:
            if not ids:
                prompt_arg = prompt_for(client, prompt, raw=raw, system=system)
            stream = client.stream(
                prompt_arg, max_new_tokens=max_new_tokens, speculation=speculation, slo_tpot_ms=slo_tpot_ms,
                slo_ttft_ms=slo_ttft_ms, stop=stop or (), priority=priority, logprobs=logprobs,
                **sampling_args(temperature, top_p, seed, top_k, min_p, repetition_penalty),
            )  # fmt: skip
            with stream:
                for event in stream:
                    # token ids only for an id prompt on a server without text (an EOS token has no text either)
                    sys.stdout.write(event.text if not ids or event.text else "".join(f"{t} " for t in event.token_ids))
                    sys.stdout.flush()
            r = stream.result
    except TandemError as exc:
        err.print(f"[red]{exc}[/]", soft_wrap=True)  # one line, however long
        raise typer.Exit(1) from None
    sys.stdout.write("\n")
    if logprobs is not None:
        err.print(logprobs_table(r.logprobs), markup=False, highlight=False, soft_wrap=True)
    err.print(f"[dim]{stats_line(r, slo=slo_tpot_ms is not None or slo_ttft_ms is not None)}[/]")


@app.command()
def status(addr: AddrOption = DEFAULT_ADDR, tls: TlsOption = False, ca: CaOption = None) -> None:
    """The scheduler's health, policies, load and the model services behind it."""
    from sdk.client import Client
    from sdk.errors import TandemError

    console = Console()
    try:
        with Client(addr, control_timeout=5, **client_tls(tls, ca)) as client:
            health, info = client.health(), client.info()
    except TandemError as exc:
        console.print(f"[red]{addr}: {exc}[/]", soft_wrap=True)
        raise typer.Exit(1) from None
    console.print(
        f"{addr}: [green]{health}[/]  version {info.service_version}  queue {info.queue_policy}  "
        f"speculation {info.speculation_policy}  running {info.num_running}  waiting {info.num_waiting}"
    )
    table = Table("role", "model", "device", "dtype", "vocab", "context", "KV free/total", "live seqs")
    for role, m in (("target", info.target), ("draft", info.draft)):
        if m is None:
            table.add_row(role, "[yellow]unavailable or none[/]", *[""] * 6)
        else:
            table.add_row(
                role, m.model_name, m.device, m.dtype, str(m.vocab_size), str(m.max_context),
                f"{m.kv_blocks_free}/{m.kv_blocks_total}", str(m.num_live_seqs),
            )  # fmt: skip
    console.print(table)


def _launch_tls(cert, key, ca, internal_cert, internal_key, internal_ca, internal_mtls: bool) -> dict:
    """LaunchConfig keywords of `tandem up`'s TLS options (unset ones stay out: the launcher's defaults apply)."""
    values = {"tls_cert": cert, "tls_key": key, "tls_ca": ca, "internal_tls_cert": internal_cert,
              "internal_tls_key": internal_key, "internal_tls_ca": internal_ca, "internal_mtls": internal_mtls or None}
    return {name: value for name, value in values.items() if value is not None}


def _print_tls(console: Console, stack) -> None:
    """How to reach a stack whose public endpoint speaks TLS, and what protects the hops inside."""
    plan = stack.tls
    if plan.public is not None:
        console.print(f'over TLS:  tandem generate "Once upon a time" --addr {stack.endpoints.scheduler} '
                      f"--ca {plan.public_ca}")
    if plan.internal is not None:
        console.print(f"scheduler -> model services: {'mutual TLS' if plan.internal.mutual else 'TLS'} "
                      "+ the internal secret")


if __name__ == "__main__":
    app()
