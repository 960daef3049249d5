"""Tuned lens for early exit: zero translators are the logit lens, files round-trip, a vocabulary subset only
prunes less, and an engine checking through a lens stays lossless and checks only the lens's layers."""

import pytest
import torch

from shared.engine import tuned_lens
from shared.engine.early_exit import EarlyExitConfig
from shared.engine.draft_engine import DraftEngine
from shared.engine.target_engine import TargetEngine
from shared.engine.tuned_lens import TunedLens
from shared.models.tiny import build_tiny

from conftest import Reference, make_runner
from test_early_exit import run_sd
from test_lossless_greedy import NUM_TOKENS, SHAPES, prompts_for

HIDDEN, VOCAB = 16, 40


def _head():
    torch.manual_seed(0)
    return torch.nn.LayerNorm(HIDDEN), torch.nn.Linear(HIDDEN, VOCAB, bias=False)


def _plain_counts(norm, head, hidden, pidx, tokens):
    logits = head(norm(hidden))
    own = logits[pidx, tokens]
    return (logits[pidx] > own[:, None]).sum(-1)


def test_zero_translators_are_the_logit_lens():
    norm, head = _head()
    lens = TunedLens(HIDDEN, [1, 3])
    hidden = torch.randn(5, HIDDEN)
    assert torch.equal(lens(1, hidden), hidden) and torch.equal(lens(2, hidden), hidden)
    pidx, tokens = torch.tensor([0, 0, 2, 4]), torch.tensor([1, 7, 39, 0])
    assert torch.equal(lens.tokens_above(1, hidden, norm, head, pidx, tokens), _plain_counts(norm, head, hidden, pidx, tokens))


def test_a_trained_translator_changes_the_reading_only_at_its_layer():
    lens = TunedLens(HIDDEN, [2])
    torch.nn.init.normal_(lens.translator["2"].weight)
    hidden = torch.randn(3, HIDDEN)
    assert not torch.allclose(lens(2, hidden), hidden)
    assert torch.equal(lens(1, hidden), hidden)


def test_a_vocabulary_subset_prunes_less_and_never_outside_it():
    norm, head = _head()
    vocab = torch.tensor([0, 3, 5, 7, 11, 13, 17, 19, 23, 29])
    lens = TunedLens(HIDDEN, [1], vocab)
    lens.attach_head(head.weight)
    hidden = torch.randn(6, HIDDEN)
    pidx = torch.arange(6).repeat_interleave(VOCAB)
    tokens = torch.arange(VOCAB).repeat(6)
    full = _plain_counts(norm, head, hidden, pidx, tokens)
    sub = lens.tokens_above(1, hidden, norm, head, pidx, tokens)
    assert bool((sub <= full).all())  # outside the subset's top-K => outside the whole top-K
    outside = ~torch.isin(tokens, vocab)
    assert bool((sub[outside] == 0).all())  # a token the subset lacks is never pruned
    assert int(sub[~outside].max()) == len(vocab) - 1  # ranks run over the subset


def test_save_and_load_round_trip(tmp_path):
    lens = TunedLens(HIDDEN, [1, 4], torch.tensor([2, 9, 30]))
    torch.nn.init.normal_(lens.translator["4"].weight)
    lens.save(tmp_path, meta={"target": "tiny"})
    back = tuned_lens.load(tmp_path)
    assert back.layers == [1, 4] and back.vocab.tolist() == [2, 9, 30]
    assert torch.equal(back.translator["4"].weight, lens.translator["4"].weight.half().float())  # stored in float16
    assert tuned_lens.read_meta(tmp_path) == {"target": "tiny"}
    assert tuned_lens.load(tmp_path / "elsewhere") is None


def test_a_malformed_lens_file_is_refused(tmp_path):
    from safetensors.torch import save_file

    save_file({"translator.x.weight": torch.zeros(2, 2)}, str(tmp_path / tuned_lens.FILE_NAME))
    with pytest.raises(ValueError, match="unexpected tensor"):
        tuned_lens.load(tmp_path)
    save_file({"translator.1.weight": torch.zeros(2, 2)}, str(tmp_path / tuned_lens.FILE_NAME))
    with pytest.raises(ValueError, match="incomplete"):
        tuned_lens.load(tmp_path)


@pytest.fixture(scope="module")
def deep_target():
    return build_tiny("llama", vocab_size=96, seed=0, num_layers=6)


TINY_HIDDEN = 64  # build_tiny's hidden size


def _lens_dir(tmp_path, layers, vocab=None, scale=0.5):
    lens = TunedLens(TINY_HIDDEN, layers, vocab)
    g = torch.Generator().manual_seed(3)
    for lin in lens.translator.values():
        lin.weight.data = torch.randn(TINY_HIDDEN, TINY_HIDDEN, generator=g) * scale / TINY_HIDDEN**0.5
    lens.save(tmp_path)
    return tmp_path


def test_engine_checks_only_the_lens_layers(deep_target, tmp_path):
    assert deep_target.config.hidden_size == TINY_HIDDEN
    cfg = EarlyExitConfig(enabled=True, init_layer=1, k_init=3, k_final=3, gate=False)
    target = TargetEngine(make_runner(deep_target))
    target.set_early_exit(cfg, _lens_dir(tmp_path, [2, 4]))
    assert target.early_exit.layers == {2, 4} and target.runner.exit_lens is not None
    target.set_early_exit(cfg.model_copy(update={"lens": "off"}), tmp_path)
    assert target.runner.exit_lens is None and target.early_exit.layers == {1, 2, 3, 4}
    target.set_early_exit(cfg, None)  # auto without a directory: the logit lens
    assert target.runner.exit_lens is None
    with pytest.raises(ValueError, match="no tuned_lens"):
        target.set_early_exit(cfg.model_copy(update={"lens": str(tmp_path / "missing")}), None)
    with pytest.raises(ValueError, match="does not fit"):
        target.set_early_exit(cfg, _lens_dir(tmp_path / "deep", [5]))  # the last layer has nothing left to save


@pytest.mark.parametrize("vocab", [None, torch.arange(0, 96, 2)])
@pytest.mark.parametrize("shape", ["chain4", "tree3x2"])
def test_early_exit_through_a_lens_never_changes_greedy_output(deep_target, tmp_path, vocab, shape):
    reference = Reference(deep_target)
    prompts = prompts_for(3, seed=21)
    target = TargetEngine(make_runner(deep_target))
    target.set_early_exit(EarlyExitConfig(enabled=True, init_layer=1, k_init=3, k_final=3, gate=False),
                          _lens_dir(tmp_path, [1, 3], vocab))  # fmt: skip
    draft = DraftEngine(make_runner(build_tiny("llama", vocab_size=96, seed=1, hidden_size=32, num_layers=1)))
    outs, drafted, pruned = run_sd(target, draft, prompts, SHAPES[shape])
    for k, prompt in prompts.items():
        assert outs[k] == reference.greedy(prompt, NUM_TOKENS), k
    assert drafted and pruned > 0  # a random draft falls outside the top 3 through the lens too
    target.release(list(prompts))
