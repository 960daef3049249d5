"""`tandem chat`: a multi-turn conversation in the terminal, and the prompt `tandem generate` sends.

    $ tandem chat --system "You are terse."
    you> What is the capital of France?
    The capital of France is Paris.
    turn 1, context 46 tokens: 8 tokens (eos), TTFT 41.2 ms, TPOT 18.3 ms, 2.33 tokens/step, acceptance 33%   (dim)
    you> /exit

Templating happens on the server, where the target's tokenizer lives: the client sends the
conversation (GenerateRequest.chat) and the scheduler renders it with the model's chat template,
the same path as the HTTP API's /v1/chat/completions. ``TandemInfo.chat_template`` says whether the
served model has one; `tandem generate` applies it when it does (``--raw`` sends the text as it is).

In the chat: ``/exit`` (or Ctrl-D) leaves, ``/reset`` forgets the conversation, ``/help`` lists both;
Ctrl-C during an answer stops it (the server aborts the request) and the turn is dropped.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.console import Console

from sdk.cli_options import (
    DEFAULT_ADDR, AddrOption, CaOption, MinPOption, RepetitionPenaltyOption, SeedOption, TlsOption, TopKOption,
    client_tls, SloTpotOption, SloTtftOption, SpecOption, SystemOption, TemperatureOption, TopPOption,
    sampling_args, speculation_arg,
)  # fmt: skip
from sdk.stats_line import stats_line

COMMANDS = {"/exit": "leave (Ctrl-D too)", "/quit": "leave", "/reset": "forget the conversation", "/help": "this list"}


def conversation(user: str, system: str | None = None, history: list[dict] | None = None) -> list[dict]:
    """The messages of one request: the system message (if any), the turns so far, the new user turn."""
    head = [{"role": "system", "content": system}] if system else []
    return [*head, *(history or []), {"role": "user", "content": user}]


def prompt_for(client, text: str, *, raw: bool, system: str | None) -> str | list[dict]:
    """What `tandem generate` sends: the text in the model's chat template when it has one, else as it is."""
    if raw:
        if system:
            raise typer.BadParameter("--system needs the chat template; drop --raw")
        return text
    if client.info().chat_template:
        return conversation(text, system)
    if system:
        raise typer.BadParameter("the served model has no chat template, so --system cannot apply; drop it")
    return text


def chat(
    addr: AddrOption = DEFAULT_ADDR,
    system: SystemOption = None,
    max_new_tokens: Annotated[int, typer.Option(help="Tokens per answer at most.")] = 256,
    spec: SpecOption = "auto",
    slo_tpot_ms: SloTpotOption = None,
    slo_ttft_ms: SloTtftOption = None,
    temperature: TemperatureOption = 0.0,
    top_p: TopPOption = 1.0,
    seed: SeedOption = None,
    top_k: TopKOption = 0,
    min_p: MinPOption = 0.0,
    repetition_penalty: RepetitionPenaltyOption = 1.0,
    tls: TlsOption = False,
    ca: CaOption = None,
) -> None:
    """Talk with the served model: streamed answers, speculation stats after each (/exit leaves)."""
    from sdk.client import Client
    from sdk.errors import TandemError

    console = Console(highlight=False)
    options = dict(max_new_tokens=max_new_tokens, speculation=speculation_arg(spec), slo_tpot_ms=slo_tpot_ms,
                   slo_ttft_ms=slo_ttft_ms, **sampling_args(temperature, top_p, seed, top_k, min_p, repetition_penalty))
    has_slo = slo_tpot_ms is not None or slo_ttft_ms is not None
    try:
        import readline  # noqa: F401 - line editing and history for input()
    except ImportError:
        pass
    history: list[dict] = []
    try:
        with Client(addr, **client_tls(tls, ca)) as client:
            info = client.info()
            if not info.chat_template:
                console.print(f"[red]{addr} serves a model without a chat template; use `tandem generate`[/]")
                raise typer.Exit(1)
            model = info.target.model_name if info.target else "the model"
            console.print(f"[dim]chatting with {model} at {addr}; /exit leaves, /reset forgets, /help[/]")
            while True:
                try:
                    line = console.input("[bold green]you>[/] ").strip()
                except (EOFError, KeyboardInterrupt):
                    console.print()
                    break
                if not line:
                    continue
                if line in ("/exit", "/quit"):
                    break
                if line == "/reset":
                    history.clear()
                    console.print("[dim]conversation forgotten[/]")
                    continue
                if line == "/help" or line.startswith("/"):
                    for name, what in COMMANDS.items():
                        console.print(f"[dim]{name:7} {what}[/]")
                    continue
                answer = _turn(client, console, conversation(line, system, history), options, has_slo)
                if answer is not None:
                    history += [{"role": "user", "content": line}, {"role": "assistant", "content": answer}]
    except TandemError as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(1) from None


def _turn(client, console: Console, messages: list[dict], options: dict, has_slo: bool) -> str | None:
    """Stream one answer; its stats as a dim line. None when it failed or was interrupted (the turn is dropped)."""
    from sdk.errors import TandemError

    try:
        with client.stream(messages, **options) as stream:
            for event in stream:
                sys.stdout.write(event.text)
                sys.stdout.flush()
        result = stream.result
    except KeyboardInterrupt:
        console.print("\n[yellow]stopped[/]")
        return None
    except TandemError as exc:  # e.g. the conversation outgrew the context window: /reset
        console.print(f"\n[red]{exc}[/]")
        return None
    console.print()
    turn = sum(m["role"] == "user" for m in messages)
    line = f"turn {turn}, context {result.num_prompt_tokens} tokens: {stats_line(result, slo=has_slo)}"
    console.print(f"[dim]{line}[/]", soft_wrap=True)  # one line, however narrow the terminal (it wraps, not rich)
    return result.text
