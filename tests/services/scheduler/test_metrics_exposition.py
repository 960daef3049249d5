"""The scheduler's and a model service's /metrics: vLLM's names where routers read them, units in names,
no moving-average gauges, and `promtool check metrics` clean (skipped where promtool is not installed;
`make setup` installs it where apt can)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time

import pytest

from sdk import Client

PROMTOOL = shutil.which("promtool")


# promtool's one lint vLLM's own names fail (colons are meant for recording rules); routers read exactly those
COLON_LINT = "metric names should not contain ':'"


def promtool_check(text: str) -> None:
    """No problem promtool reports, except the colon lint on the ``vllm:`` series."""
    if PROMTOOL is None:
        pytest.skip("promtool not installed (Debian: apt-get install prometheus)")
    done = subprocess.run([PROMTOOL, "check", "metrics"], input=text.encode(), capture_output=True, timeout=60)
    problems = [line for line in (done.stdout + done.stderr).decode().splitlines()
                if line.strip() and not (line.startswith("vllm:") and line.endswith(COLON_LINT))]  # fmt: skip
    assert not problems, "\n".join(problems)


def test_scheduler_metrics_carry_vllm_names_and_pass_promtool(token_stack):
    with Client(token_stack.address) as client:
        for k in (0, 3):
            client.generate([1, 2, 3, 4], max_new_tokens=9, speculation=k or "off")
    label = '{model_name="toy"}'
    deadline = time.monotonic() + 30
    while True:  # the tandem_* and vllm:* observers are deferrable: the last step's counts land while the loop idles
        text = token_stack.metrics.render()
        values = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        caught_up = values.get("tandem_draft_tokens_proposed_total") == values.get(
            f"vllm:spec_decode_num_draft_tokens_total{label}") and values.get(
            f"vllm:e2e_request_latency_seconds_count{label}") == 2
        if caught_up or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert values[f"vllm:generation_tokens_total{label}"] == 18
    assert values[f"vllm:prompt_tokens_total{label}"] == 8
    assert values[f"vllm:num_requests_running{label}"] == 0 and values[f"vllm:num_requests_waiting{label}"] == 0
    assert values[f"vllm:kv_cache_usage_perc{label}"] == 0
    drafted = values[f"vllm:spec_decode_num_draft_tokens_total{label}"]
    assert drafted > 0 and values[f"vllm:spec_decode_num_drafts_total{label}"] * 3 == drafted
    assert values[f"vllm:spec_decode_num_accepted_tokens_total{label}"] == values["tandem_draft_tokens_accepted_total"]
    assert values[f"vllm:time_to_first_token_seconds_count{label}"] == 2
    assert values[f"vllm:e2e_request_latency_seconds_count{label}"] == 2
    assert values['vllm:request_success_total{finished_reason="length",model_name="toy"}'] == 2
    assert "tandem_accepted_length_tokens_count" in text and "tandem_acceptance_rate" not in text
    promtool_check(text)


def test_model_service_metrics_pass_promtool(tiny_model_dir):
    from services.engine_metrics import EngineMetrics
    from services.engine_host import EngineHost
    from shared.engine.types import PrefillItem, SamplingParams, TokenTree, VerifyItem

    async def run() -> str:
        host = await EngineHost.load(_settings(tiny_model_dir), "target")
        host.metrics = EngineMetrics(host)
        try:
            engine = host.engine
            await host.run(engine.step, [PrefillItem("a", [1, 2, 3]), PrefillItem("b", [4, 5])], [])
            await host.run(engine.step, [], [VerifyItem("a", TokenTree.chain([7, 8])), VerifyItem("b")])
            engine.runner.get("b").sampling = SamplingParams(logprobs=1)
            await host.run(engine.step, [], [VerifyItem("a"), VerifyItem("b")])
            return host.metrics.exposition()[0].decode()
        finally:
            host.close()

    text = asyncio.run(run())
    assert 'tandem_engine_call_seconds_count{call="step",role="target"} 3.0' in text
    assert 'tandem_kv_blocks{role="target",state="used"}' in text
    assert 'tandem_target_steps_total{path="static"} 1.0' in text
    assert 'tandem_target_steps_total{path="static_host_accept"} 1.0' in text
    assert 'tandem_engine_batch_sequences_sum{call="step",role="target"} 6.0' in text
    promtool_check(text)


def _settings(model_dir):
    from services.settings import ServiceSettings

    return ServiceSettings(model=str(model_dir), port=0, device="cpu", num_blocks=64, block_size=4)


def test_the_load_gauges_are_read_from_the_scheduler_when_scraped():
    """Queue depth, running requests and KV usage are read at the scrape (``set_function``), not set every step:
    a submitted request shows at once, with no step run and no observer called."""
    from scheduler.engine_loop import Scheduler, SchedulerConfig
    from scheduler.request import Request
    from scheduler.testing import FakeTarget, ToyLM
    from services.scheduler.observers.metrics import MetricsObserver
    from services.scheduler.observers.vllm_metrics import VllmMetricsObserver
    from shared.metrics import TandemMetrics

    metrics = TandemMetrics()
    sched = Scheduler(FakeTarget(ToyLM()), config=SchedulerConfig(max_tokens_in_flight=1000))
    MetricsObserver(metrics, sched)
    VllmMetricsObserver(metrics.registry, sched, "toy")
    read = metrics.registry.get_sample_value
    label = {"model_name": "toy"}
    assert read("vllm:num_requests_waiting", label) == 0 and read("tandem_queue_depth", {"queue": "all"}) == 0
    for i in range(3):
        sched.submit(Request(id=f"r{i}", prompt_ids=[1, 2, 3], max_new_tokens=7))
    assert read("vllm:num_requests_waiting", label) == 3 and read("tandem_queue_depth", {"queue": "all"}) == 3
    assert read("vllm:num_requests_running", label) == 0 == read("tandem_running_requests")

    async def one_step():
        await sched.step()

    asyncio.run(one_step())  # admits all three: each reserves prompt + max_new_tokens = 10 of the 1000
    assert read("vllm:num_requests_running", label) == 3 == read("tandem_running_requests")
    assert read("vllm:num_requests_waiting", label) == 0
    assert read("vllm:kv_cache_usage_perc", label) == pytest.approx(0.03)
