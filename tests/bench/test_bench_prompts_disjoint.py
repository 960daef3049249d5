"""Benchmark prompts never reach a training corpus: the EAGLE head's corpus drops every prompt that
equals, contains or is contained in a benchmark message (all kinds, every agent turn)."""

from __future__ import annotations

from bench import prompts
from shared.models.distill import corpus
from shared.models.eagle.__main__ import exclude_bench


def test_every_kind_builds_offline_and_the_training_corpus_is_disjoint():
    texts = prompts.all_bench_texts()
    for kind in prompts.KINDS:
        assert prompts.load(kind, 3, seed=1), kind
    agent = prompts.load("agent", 1)[0]
    assert len(agent.messages()) == 5 and "<tool_output>" in agent.text  # multi-turn, tool output repeated
    bench = [t.strip().lower() for t in texts]
    kept = exclude_bench(corpus.build())
    assert 0 < len(kept) < len(corpus.build())  # some templated questions collide with bench chat: dropped
    for p in kept:
        t = p.text.strip().lower()
        assert not any(t in b or b in t for b in bench), p.text


def test_bench_texts_overlap_equals_the_pairwise_check():
    """BenchTexts' one search over the joined texts plus the shorter needles answers as the pairwise check does
    (equal, inside or containing, case and surrounding space aside), with NULs, empties and no bench at all."""
    import random

    rng = random.Random(0)
    words = ["alpha", "beta", "gamma", "delta", "eps", "zeta"]
    bench = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 6))) for _ in range(200)] + ["  Gamma Beta  ", ""]
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 6))) for _ in range(500)]
    texts += ["x\x00y", "", "GAMMA beta", "zeta\x00"]
    for given in (bench, [b for b in bench if b], []):
        texts_of = prompts.BenchTexts(given)
        lowered = [b.strip().lower() for b in given]
        for text in texts:
            t = text.strip().lower()
            assert texts_of.overlaps(text) == any(t in b or b in t for b in lowered), (text, len(given))
