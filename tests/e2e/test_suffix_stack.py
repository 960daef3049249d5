"""The model-free suffix-tree draft in a real stack: draft service (suffix trees) + tiny target + scheduler + Redis.

The tiny random target falls into loops on a repetitive prompt, so its output
is copy-heavy: suffix drafting should get drafts accepted there, while the
output stays token-for-token the target's greedy output (chains and trees,
batched, across a draft restart) and sampled output follows the target's
distribution.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import grpc
import pydantic
import pytest
import torch

from sdk import Client, FinishReason
from services.scheduler.stream_workers import IDLE_FLUSH_S
from tests.support.tiny_stack import VOCAB, Stack, tiny_stack

SPEC = "suffix:max_depth=32,alpha=3"
COPY_HEAVY = [7, 8, 9] * 3  # the tiny target answers 35 35 35 ... 399 35 399 35 ... 152 9 64 152 9 64 ...
PROMPTS = [COPY_HEAVY, [3, 1, 4, 1, 5], [100, 200, 300, 400, 5, 6, 7, 8, 9, 10, 11] * 2, [27, 18]]


@pytest.fixture(scope="module")
def suffix_stack(tiny_pair) -> Iterator[Stack]:
    with tiny_stack(tiny_pair[0], SPEC, vocab_size=VOCAB) as running:
        yield running


@contextmanager
def scheduler_for(stack: Stack, model, policy: str, home, **settings) -> Iterator:
    """A second scheduler over the stack's target and draft, with ``policy`` for AUTO requests."""
    from services.scheduler.main import start
    from services.settings import ServiceSettings

    running = stack.loop.run(
        start(
            ServiceSettings(
                port=0, trace_exporter="none", shutdown_grace_s=0.5, model=str(model), home=home,
                target_addr=stack.target.address, draft_addr=stack.draft.address, redis_url=stack.redis_url,
                speculation_policy=policy, **settings,
            )  # fmt: skip
        )
    )
    try:
        yield running
    finally:
        stack.loop.run(running.stop())


def _generate_all(address: str, requests: list[dict]) -> list:
    with Client(address, timeout=120) as client, ThreadPoolExecutor(len(requests)) as pool:
        return [f.result() for f in [pool.submit(client.generate, **r) for r in requests]]


def _wait(cond, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def test_suffix_draft_chains_are_lossless_batched_and_accepted(suffix_stack, reference):
    lengths = [40, 17, 29, 9]
    with Client(suffix_stack.address, timeout=120) as client:
        info = client.info()
        assert info.draft is not None
        assert info.draft.model_name == "suffix(max_depth=32,max_match=12,alpha=3,min_prob=0.1,global_tokens=65536)"
        assert (info.draft.kv_blocks_total, info.draft.dtype, info.draft.vocab_size) == (0, "none", VOCAB)
    requests = [dict(prompt=p, max_new_tokens=n, speculation=4) for p, n in zip(PROMPTS, lengths)]
    results = _generate_all(suffix_stack.address, requests)  # one batch, different lengths
    for p, n, r in zip(PROMPTS, lengths, results):
        assert r.finish_reason == FinishReason.LENGTH
        assert r.token_ids == reference.greedy(p, n)
    copy = results[0]
    assert copy.stats.num_draft_tokens > 0 and copy.stats.num_accepted_tokens > 0
    assert copy.stats.mean_accepted_length > 1  # fewer verify steps than tokens
    # what finished feeds the global tree: the same prompt again is drafted from the first answer
    with Client(suffix_stack.address, timeout=120) as client:
        again = client.generate(COPY_HEAVY, max_new_tokens=40, speculation=4)
        plain = client.generate(COPY_HEAVY, max_new_tokens=40, speculation="off")
    assert again.token_ids == plain.token_ids == copy.token_ids
    assert again.stats.num_accepted_tokens > copy.stats.num_accepted_tokens
    assert plain.stats.num_draft_tokens == 0


@pytest.mark.parametrize("policy", ["adaserve", "specinfer"])
def test_suffix_draft_trees_are_lossless_under_tree_policies(suffix_stack, tiny_pair, reference, tmp_path, policy):
    lengths = [33, 12, 25, 20]
    requests = [dict(prompt=p, max_new_tokens=n, speculation="auto") for p, n in zip(PROMPTS, lengths)]
    with scheduler_for(suffix_stack, tiny_pair[0], policy, tmp_path) as running:
        results = _generate_all(running.address, requests)
    for p, n, r in zip(PROMPTS, lengths, results):
        assert r.finish_reason == FinishReason.LENGTH
        assert r.token_ids == reference.greedy(p, n), policy
    assert sum(r.stats.num_accepted_tokens for r in results) > 0  # trees were drafted and verified


def test_frontier_pipelining_rolls_the_suffix_draft_back(suffix_stack, tiny_pair, reference, tmp_path):
    """Frontier pipelining drafts on an optimistic prefix and rolls it back on a miss (SpecItem.rollback):
    the suffix draft truncates its tree instead of failing, so every step keeps a draft. Every step pipelines
    (measured=false): the measured gate would keep some serial, and a test of the mechanism needs its steps."""
    lengths = [40, 23, 31, 18]
    requests = [dict(prompt=p, max_new_tokens=n, speculation=3) for p, n in zip(PROMPTS, lengths)]
    suffix_stack.draft.tracer_provider.memory_exporter.clear()
    with scheduler_for(suffix_stack, tiny_pair[0], "fixed:3", tmp_path, frontier="chunk=2,measured=false") as running:
        results = _generate_all(running.address, requests)
        stats = running.scheduler.frontier.stats
    for p, n, r in zip(PROMPTS, lengths, results):
        assert r.token_ids == reference.greedy(p, n)
    assert stats.steps > 0 and stats.resets > 0 and stats.advances > 0
    speculates = [
        s for s in suffix_stack.draft.tracer_provider.memory_exporter.get_finished_spans()
        if s.name.endswith("DraftService/Speculate")
    ]  # fmt: skip
    assert speculates and all(s.status.is_ok for s in speculates)  # no rollback was refused


def test_a_restarted_suffix_draft_loses_nothing_and_drafts_again(suffix_stack, reference):
    prompts = [COPY_HEAVY, [5, 6, 7, 5, 6, 7, 5], [11, 12, 13, 14]]
    lengths = [700, 700, 700]  # long enough that the draft comes back (1 s backoff) while they run
    sched = suffix_stack.scheduler.scheduler
    # a short retry backoff: with the default (1 s, doubling) the requests could finish before the loop retried
    # the restarted draft on a fast machine, and then nothing is re-prefilled (a race, not the behaviour under test)
    backoff = sched.link.retry_initial_s, sched.link.retry_max_s
    sched.link.retry_initial_s = sched.link.retry_max_s = 0.05
    with Client(suffix_stack.address, timeout=180) as client, ThreadPoolExecutor(3) as pool:
        streams = [client.stream(p, max_new_tokens=n, speculation=3) for p, n in zip(prompts, lengths)]
        iterators = [iter(s) for s in streams]
        for it in iterators:
            next(it)  # every request is running
        suffix_stack.loop.run(suffix_stack.draft.stop(0))
        _wait(lambda: not sched.draft_available)
        futures = [pool.submit(list, it) for it in iterators]
        time.sleep(0.3)  # a few plain-decoding steps while the draft is gone
        suffix_stack.restart_draft()
        for f in futures:
            f.result(timeout=180)
    sched.link.retry_initial_s, sched.link.retry_max_s = backoff
    for s, p, n in zip(streams, prompts, lengths):
        assert s.result.finish_reason == FinishReason.LENGTH
        assert s.result.token_ids == reference.greedy(p, n)
    spans = suffix_stack.draft.tracer_provider.memory_exporter.get_finished_spans()  # the restarted service's
    prefilled = [s.attributes["tandem.prefill_tokens"] for s in spans if s.name.endswith("DraftService/Prefill")]
    assert prefilled and max(prefilled) > len(COPY_HEAVY)  # running requests came back: prompt + output so far
    assert any(s.name.endswith("DraftService/Speculate") for s in spans)
    with Client(suffix_stack.address, timeout=60) as client:
        again = client.generate(COPY_HEAVY, max_new_tokens=30, speculation=3)
    assert again.token_ids == reference.greedy(COPY_HEAVY, 30) and again.stats.num_accepted_tokens > 0


def test_bad_input_gets_a_clear_status_and_the_draft_stays_usable(suffix_stack):
    from shared.rpc.gen.tandem.v1 import common_pb2, draft_pb2, draft_pb2_grpc

    def item(seq_id, prompt):
        return common_pb2.PrefillItem(seq_id=seq_id, prompt_ids=prompt)

    P, S, spec = draft_pb2.DraftPrefillRequest, draft_pb2.SpeculateRequest, draft_pb2.SpecItem
    with grpc.insecure_channel(suffix_stack.draft.address) as channel:
        stub = draft_pb2_grpc.DraftServiceStub(channel)
        time.sleep(4 * IDLE_FLUSH_S)  # the earlier tests' last releases ride alone after IDLE_FLUSH_S
        live_before = stub.Info(common_pb2.InfoRequest()).num_live_seqs
        stub.Prefill(P(items=[item("bad-input", [1, 2, 3, 1, 2])]))
        cases = [
            (stub.Speculate, S(items=[spec(seq_id="ghost", new_tokens=[1])]), "NOT_FOUND", "ghost"),
            (stub.Prefill, P(items=[item("bad-input", [1])]), "ALREADY_EXISTS", "already live"),
            (stub.Prefill, P(items=[item("x", [])]), "INVALID_ARGUMENT", "empty prompt"),
            (stub.Prefill, P(items=[item("x", [1, VOCAB])]), "INVALID_ARGUMENT", f"token id {VOCAB}"),
            (stub.Speculate, S(items=[spec(seq_id="bad-input", new_tokens=[1 << 20])]), "INVALID_ARGUMENT",
             "outside the vocabulary"),
            (stub.Speculate, S(items=[spec(seq_id="bad-input", new_tokens=[3], rollback=9)]), "INVALID_ARGUMENT",
             "roll back"),
            (stub.Speculate, S(items=[spec(seq_id="bad-input", chain=draft_pb2.ChainShape(length=33))]),
             "INVALID_ARGUMENT", "chain length"),
            (stub.Speculate, S(items=[spec(seq_id="bad-input", new_tokens=[3]), spec(seq_id="ghost")]), "NOT_FOUND",
             "ghost"),
            (stub.Offload, draft_pb2.OffloadRequest(), "UNIMPLEMENTED", "no weights"),
            (stub.Reload, draft_pb2.ReloadRequest(), "UNIMPLEMENTED", "model-free"),
        ]  # fmt: skip
        for call, request, code, words in cases:
            with pytest.raises(grpc.RpcError) as err:
                call(request)
            assert err.value.code().name == code and words in err.value.details(), err.value.details()
        # nothing changed: the failed batches applied no token, and the sequence drafts as before
        good = spec(seq_id="bad-input", new_tokens=[3], chain=draft_pb2.ChainShape(length=2))
        reply = stub.Speculate(S(items=[good]))
        assert list(reply.outputs[0].tree.token_ids) == [1, 2]  # "1 2 3" seen before: what followed it
        assert list(reply.outputs[0].tree.draft_probs) == [1.0, 1.0]
        stub.Release(common_pb2.ReleaseRequest(seq_ids=["bad-input"]))
        assert stub.Info(common_pb2.InfoRequest()).num_live_seqs == live_before
    with Client(suffix_stack.address, timeout=60) as client:
        assert client.generate([3, 1, 4, 1, 5], max_new_tokens=6, speculation=3).finish_reason == FinishReason.LENGTH


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("suffix:", "not KEY=VALUE"),
        ("suffix:depth=8", "unknown key 'depth'"),
        ("suffix:max_depth=1", "max_depth"),
        ("suffix:alpha=x", "alpha"),
        ("suffix:max_match=30", "must be below max_depth"),
    ],
)
def test_a_malformed_suffix_spec_fails_at_startup(tiny_pair, tmp_path, spec, words):
    from services.launcher import LaunchConfig, LaunchError, launch
    from services.settings import ServiceSettings

    with pytest.raises(pydantic.ValidationError, match="malformed suffix draft") as err:
        ServiceSettings.from_env(env={"TANDEM_MODEL": spec})
    assert words in str(err.value)
    config = LaunchConfig(target_model=str(tiny_pair[0]), draft_model=spec, log_dir=tmp_path / "logs")
    with pytest.raises(LaunchError, match="malformed suffix draft"):
        with launch(config):
            pass
    assert not list((tmp_path / "logs").glob("*.log"))  # nothing was started


def test_a_suffix_spec_is_refused_for_the_target():
    from services.settings import ServiceSettings
    from shared.engine.errors import ModelLoadError

    settings = ServiceSettings(model="suffix:max_depth=8,max_match=4")
    assert settings.suffix("draft").max_depth == 8 and settings.ngram("draft") is None
    with pytest.raises(ModelLoadError, match="target service needs a model"):
        settings.model_path("target")
    with pytest.raises(ModelLoadError, match="model-free"):
        settings.model_path("draft")


# ---------------------------------------------------------------------------- sampling over gRPC

SMALL_VOCAB = 12
NUM_SAMPLES = 600


@pytest.fixture(scope="module")
def small_stack(tmp_path_factory) -> Iterator[tuple[Stack, object]]:
    """A 12-token target (wide logits: distributions the test can tell apart) with the suffix draft."""
    from shared.models.tiny import save_tiny

    model_dir = save_tiny(
        tmp_path_factory.mktemp("small") / "target", "llama", vocab_size=SMALL_VOCAB, num_layers=2, seed=11,
        initializer_range=0.3,
    )  # fmt: skip
    with tiny_stack(model_dir, "suffix:alpha=3,min_prob=0", vocab_size=SMALL_VOCAB) as running:
        yield running, model_dir


def test_sampled_output_follows_the_target_distribution(small_stack):
    """(first, second) token pairs of sampled requests against p(t1) p(t2 | t1): the second token is drafted
    (from the prompt's repeats and the earlier answers in the global tree) and verified by rejection sampling."""
    from scipy.stats import chisquare
    from transformers import AutoModelForCausalLM

    from shared.engine.sampling import probs_from_logits
    from shared.engine.types import SamplingParams

    stack, model_dir = small_stack
    prompt = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4, 3, 3, 8, 3, 2, 7, 9, 5]
    params = SamplingParams(temperature=1.0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True).eval()
    with torch.inference_mode():
        p1 = probs_from_logits(model(torch.tensor([prompt])).logits[:, -1], params)[0]  # [vocab]
        seconds = torch.tensor([prompt + [t] for t in range(SMALL_VOCAB)])
        p2 = probs_from_logits(model(seconds).logits[:, -1], params)  # [vocab (t1), vocab (t2)]
    expected = (p1[:, None] * p2).flatten() * NUM_SAMPLES  # [vocab * vocab]

    requests = [
        dict(prompt=prompt, max_new_tokens=3, temperature=1.0, seed=seed, speculation=3) for seed in range(NUM_SAMPLES)
    ]
    with Client(stack.address, timeout=120) as client, ThreadPoolExecutor(32) as pool:
        results = list(pool.map(lambda r: client.generate(**r), requests))
    counts = torch.zeros(SMALL_VOCAB * SMALL_VOCAB)
    for r in results:
        t1, t2, _ = r.token_ids  # the third only gives the step that verifies t2 something to speculate for
        counts[t1 * SMALL_VOCAB + t2] += 1
    assert sum(r.stats.num_draft_tokens for r in results) > NUM_SAMPLES // 2  # most second tokens were drafted
    keep = expected >= 5  # pool the rare pairs, as chi-square needs
    observed = torch.cat([counts[keep], counts[~keep].sum(0, keepdim=True)])
    wanted = torch.cat([expected[keep], expected[~keep].sum(0, keepdim=True)])
    assert chisquare(observed.numpy(), wanted.numpy() * observed.sum().item() / wanted.sum().item()).pvalue > 1e-3
    assert 0 < sum(r.stats.num_accepted_tokens for r in results) < sum(r.stats.num_draft_tokens for r in results)
