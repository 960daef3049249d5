"""Options that `tandem generate` and `tandem chat` share: where the scheduler is, and how to generate."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

DEFAULT_ADDR = "127.0.0.1:50051"
AddrOption = Annotated[str, typer.Option("--addr", envvar="TANDEM_ADDR", help="host:port of the scheduler.")]
SystemOption = Annotated[str | None, typer.Option(help="System message (with the chat template).")]
SpecOption = Annotated[str, typer.Option(help="Speculation: auto, off, or a chain length k.")]
SloTpotOption = Annotated[float | None, typer.Option(help="TPOT target in ms.")]
SloTtftOption = Annotated[float | None, typer.Option(help="TTFT target in ms.")]
TemperatureOption = Annotated[float, typer.Option(help="0 = greedy.")]
TopPOption = Annotated[float, typer.Option(help="Nucleus sampling mass.")]
SeedOption = Annotated[int | None, typer.Option(help="Sampling seed.")]
TopKOption = Annotated[int, typer.Option(help="Keep the k most probable tokens; 0 = all.")]
MinPOption = Annotated[float, typer.Option(help="Drop tokens below min-p x the top token's probability.")]
RepetitionPenaltyOption = Annotated[float, typer.Option(help="> 1 makes tokens already in the prompt or output "
                                                         "less likely; 1 = none.")]


def sampling_args(temperature: float, top_p: float, seed: int | None, top_k: int, min_p: float,
                  repetition_penalty: float) -> dict:  # fmt: skip
    """The sampling keywords of `tandem generate` / `tandem chat` for ``Client.stream``."""
    return dict(temperature=temperature, top_p=top_p, seed=seed, top_k=top_k, min_p=min_p,
                repetition_penalty=repetition_penalty)  # fmt: skip


def speculation_arg(spec: str) -> str | int:
    """--spec as the SDK takes it: "auto", "off" or k."""
    if spec.isdigit():
        return int(spec)
    if spec not in ("auto", "off"):
        raise typer.BadParameter("--spec auto, off or an integer")
    return spec
TlsOption = Annotated[bool, typer.Option("--tls", help="Dial the scheduler with TLS (the system's CAs unless --ca).")]
CaOption = Annotated[Path | None, typer.Option("--ca", envvar="TANDEM_TLS_CA",
                                               help="PEM CA bundle the scheduler's certificate chains to (implies --tls).")]


def client_tls(tls: bool, ca: Path | None) -> dict:
    """Client keywords for `--tls` / `--ca`: TLS trusting ``ca`` (or the system's CAs), else plaintext."""
    from shared.rpc.tls_files import TlsConfigError, read_ca

    try:
        roots = read_ca(ca, "--ca") if ca is not None else None
    except TlsConfigError as exc:
        raise typer.BadParameter(str(exc)) from None
    return {"tls": tls or ca is not None, "root_certificates": roots}
