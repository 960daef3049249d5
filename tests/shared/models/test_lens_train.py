"""Tuned-lens training on a tiny model: hidden states at the answer rows, a translator that lowers KL, the vocabulary."""

import torch

from shared.engine.tuned_lens import TunedLens
from shared.models.distill.generate import Sample
from shared.models.lens import data, train
from shared.models.tiny import build_tiny


def _samples(n=6, vocab=96):
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        prompt = torch.randint(2, vocab, (5 + i,), generator=g).tolist()
        answer = torch.randint(2, vocab, (8,), generator=g).tolist()
        out.append(Sample(prompt, answer, torch.zeros(8, 1, dtype=torch.int32), torch.zeros(8, 1), i == 0, "chat"))
    return out


def test_hidden_states_keep_one_row_per_answer_token():
    model = build_tiny("llama", vocab_size=96, seed=0, num_layers=4).eval()
    samples = _samples()
    got = data.hidden_states(model, samples, [1, 2], batch_size=4)
    assert len(got) == sum(len(s.output_ids) for s in samples)
    assert set(got.inner) == {1, 2} and got.inner[1].shape == got.final.shape == (len(got), model.config.hidden_size)


def test_a_trained_translator_reads_the_last_layer_better_than_the_logit_lens():
    torch.manual_seed(0)
    model = build_tiny("llama", vocab_size=96, seed=0, num_layers=4).eval().requires_grad_(False)
    states = data.hidden_states(model, _samples(12), [1])
    lens = TunedLens(model.config.hidden_size, [1])
    fit = train.fit_layer(model, lens, 1, states, train.TrainConfig(epochs=30, batch_rows=32, lr=3e-3, bf16=False),
                          progress=lambda _: None)  # fmt: skip
    assert fit["last_loss"] < 0.5 * fit["first_loss"]
    (row,) = train.evaluate(model, lens, states, bf16=False)
    assert row["tuned_kl"] < row["logit_kl"] and row["tuned_top10"] >= row["logit_top10"]


def test_the_vocabulary_is_the_most_chosen_tokens_then_the_lowest_ids():
    samples = _samples()
    vocab = data.frequent_tokens(samples, 80)
    chosen = {t for s in samples if not s.heldout for t in s.output_ids}
    assert len(vocab) == 80 and chosen <= set(vocab.tolist()) and vocab.tolist() == sorted(vocab.tolist())
    assert data.coverage(vocab, samples) > 0.8 and data.coverage(None, samples) == 1.0
