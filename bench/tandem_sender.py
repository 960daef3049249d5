"""Tandem through its public SDK: one streamed ``AsyncClient`` call per request.

The configuration's speculation travels with each request (off, fixed k, or
auto = the scheduler's policy), so configurations that differ only in it
share one running stack. Token ids go in (bench.tokens encoded them), greedy,
with the job's TPOT SLO (and TTFT SLO and cache salt, where it has them). The first streamed chunk is the prefill's token;
every later chunk is one verify step, with the server's count of accepted
draft tokens.
"""

from __future__ import annotations

from sdk.client import AsyncClient

from bench.configs import Config
from bench.drivers import Job, OnChunk, Outcome, Sender


def tandem_sender(client: AsyncClient, config: Config, stop_token_ids: list[int]) -> Sender:
    if not config.is_tandem:
        raise ValueError(f"{config.name} is not a Tandem configuration")

    async def send(job: Job, on_chunk: OnChunk) -> Outcome:
        stream = client.stream(
            list(job.encoded.prompt_ids),
            max_new_tokens=job.max_new_tokens,
            stop_token_ids=stop_token_ids,
            speculation=config.speculation,
            slo_tpot_ms=job.tpot_slo_ms,
            slo_ttft_ms=job.ttft_slo_ms,
            cache_salt=job.cache_salt,
            request_id=job.request_id,
        )
        first = True
        async with stream:
            async for event in stream:
                on_chunk(event.token_ids, event.num_accepted, not first)
                first = False
        result = stream.result
        return Outcome(
            finish_reason=result.finish_reason.value,
            num_steps=result.stats.num_steps,
            num_draft_tokens=result.stats.num_draft_tokens,
            num_accepted_tokens=result.stats.num_accepted_tokens,
        )

    return send
