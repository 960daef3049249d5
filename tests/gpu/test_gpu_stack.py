"""The whole stack on the GPU: Redis, target, draft and scheduler serving the demo pair (GPU only).

The launcher starts the services as `tandem up` does, on CUDA in bfloat16 (flashinfer attention
when it is installed: the backend's "auto"). Eight chat requests at once, six with a chain of 4
and two without speculation: every one finishes, the speculative ones draft and accept tokens, both
model services report CUDA, and every output agrees with HF ``generate`` on the GPU up to a
near-tie (bench/gpu/agreement.py; δ measured with an in-process runner on the same kernels).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from bench.gpu.agreement import judge
from bench.gpu.results import record_measurement
from tests.gpu.support import DEVICE, requires_device

pytestmark = [pytest.mark.gpu, requires_device]

NEW_TOKENS = 32
SPECS = [4, 4, "off", 4, 4, "off", 4, 4]


@pytest.fixture(scope="module")
def stack(demo_pair, tmp_path_factory):
    from services.launcher import LaunchConfig, launch

    config = LaunchConfig(pair="demo", port=0, metrics_port=0, device=DEVICE, dtype="bfloat16",
                          log_dir=tmp_path_factory.mktemp("gpu-stack-logs"), startup_timeout_s=300)  # fmt: skip
    with launch(config) as running:
        yield running


def test_demo_pair_served_on_the_gpu(stack, demo_pair):
    from bench.gpu.greedy import chat_prompts, hf_generate, margins_and_delta, target_engine
    from sdk import Client, FinishReason
    from shared.engine.loading import load_causal_lm

    target_dir, _ = demo_pair
    hf = load_causal_lm(target_dir, dtype="bfloat16", device=DEVICE)
    prompts = chat_prompts(hf.tokenizer, len(SPECS))
    with Client(stack.endpoints.scheduler, timeout=300) as client:
        info = client.info()
        with ThreadPoolExecutor(len(prompts)) as pool:
            futures = [pool.submit(client.generate, p, max_new_tokens=NEW_TOKENS, speculation=s)
                       for p, s in zip(prompts, SPECS)]  # fmt: skip
            results = [f.result() for f in futures]
    assert info.target is not None and info.target.device.startswith(DEVICE), info
    assert info.draft is not None and info.draft.device.startswith(DEVICE), info
    outcome = [(r.finish_reason, len(r.token_ids), r.error) for r in results]
    done = (FinishReason.LENGTH, FinishReason.EOS, FinishReason.STOP)
    assert all(r.finish_reason in done and r.token_ids for r in results), outcome
    speculated = [r for r, s in zip(results, SPECS) if s != "off"]
    assert all(r.stats.num_draft_tokens > 0 for r in speculated)
    assert sum(r.stats.num_accepted_tokens for r in speculated) > 0

    pad = hf.tokenizer.pad_token_id if hf.tokenizer.pad_token_id is not None else 0
    engine = target_engine(load_causal_lm(target_dir, dtype="bfloat16", device=DEVICE).model, "auto", num_blocks=256)
    fp32 = load_causal_lm(target_dir, dtype="float32", device=DEVICE, with_tokenizer=False).model  # bf16's own noise
    verdicts = []
    for prompt, r in zip(prompts, results):
        ref = hf_generate(hf.model, [prompt], NEW_TOKENS, pad, exact=False)[0]
        m = min(len(r.token_ids), len(ref))  # both stop at end-of-sequence; the stack may leave it out
        reference = margins_and_delta(hf.model, engine.runner, prompt, ref, fp32_model=fp32)
        verdicts.append(judge(r.token_ids[:m], ref[:m], dtype="bfloat16", **reference))
    record_measurement("stack-demo-bf16", {
        "target": info.target.model_dump(), "draft": info.draft.model_dump(), "backend": engine.runner.backend.name,
        "tpot_ms": [r.tpot_ms for r in results], "acceptance_rate": [r.stats.acceptance_rate for r in speculated],
        "equal": sum(v.equal for v in verdicts), "verdicts": [v.as_dict() for v in verdicts],
    })  # fmt: skip
    for i, v in enumerate(verdicts):
        assert v.passed, f"request {i} (speculation {SPECS[i]}): {v.reason}"
