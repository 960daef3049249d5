"""The committed tiny trained pair: it loads, its tokenizer round-trips code, and its draft earns real acceptance."""

import pytest
import torch

from shared.engine.config import EngineConfig
from shared.engine.draft_engine import DraftEngine
from shared.engine.loading import load_causal_lm
from shared.engine.runner import ModelRunner
from shared.engine.target_engine import TargetEngine
from shared.engine.types import PrefillItem, SpecItem, TokenTree, VerifyItem
from shared.models import registry
from shared.models.paths import Paths, is_prepared
from shared.models.tiny_trained import SOURCES, TARGET, DRAFT, corpus

# From bisect.py, a held-out file (corpus.is_heldout): the models never trained on it.
HELDOUT_SNIPPET = '''def bisect_right(a, x, lo=0, hi=None, *, key=None):
    """Return the index where to insert item x in list a, assuming a is sorted.

    The return value i is such that all e in a[:i] have e <= x, and all e in
    a[i:] have e > x.  So if x already appears in the list, a.insert(i, x) will
    insert just after the rightmost x already there.
    """

    if lo < 0:
        raise ValueError('lo must be non-negative')
    if hi is None:
'''
NUM_TOKENS = 48
CHAIN_LEN = 4


@pytest.fixture(scope="module")
def pair():
    return load_causal_lm(SOURCES[TARGET]), load_causal_lm(SOURCES[DRAFT])


def test_pair_loads_with_one_tokenizer(pair):
    target, draft = pair
    assert target.tokenizer is not None and draft.tokenizer is not None
    assert target.vocab_size == draft.vocab_size == len(target.tokenizer) == 4096
    assert target.tokenizer.get_vocab() == draft.tokenizer.get_vocab()
    sizes = [sum(p.numel() for p in m.model.parameters()) for m in pair]
    assert 3e6 < sizes[0] < 5e6 and 0.5e6 < sizes[1] < 1.5e6
    assert corpus.is_heldout("bisect.py")


def test_tokenizer_round_trips_python(pair):
    tok = pair[0].tokenizer
    code = 'def f(x,\ty=None):\n    """Ünïcode — ok."""\n        return {"k": [x ** 2 for _ in range(3)]}  # 注释\n\n\n'
    ids = tok.encode(code, add_special_tokens=False)
    assert tok.decode(ids) == code
    assert len(ids) < len(code.encode())  # BPE merges: fewer tokens than bytes
    assert tok.convert_ids_to_tokens([tok.eos_token_id, tok.pad_token_id]) == [corpus.EOS, corpus.PAD]


def _runner(loaded) -> ModelRunner:
    return ModelRunner(loaded.model, EngineConfig(num_blocks=64, block_size=16))


def test_greedy_speculation_is_exact_and_accepts(pair):
    target_lm, draft_lm = pair
    prompt = target_lm.tokenizer.encode(HELDOUT_SNIPPET, add_special_tokens=False)

    # Target-only greedy through the engine: verify empty trees, one bonus token per step.
    plain = TargetEngine(_runner(target_lm))
    reference = [plain.prefill([PrefillItem("r", prompt)])[0].first_token]
    while len(reference) < NUM_TOKENS:
        reference += plain.verify([VerifyItem("r", TokenTree())])[0].tokens

    target, draft = TargetEngine(_runner(target_lm)), DraftEngine(_runner(draft_lm))
    out = [target.prefill([PrefillItem("r", prompt)])[0].first_token]
    draft.prefill([PrefillItem("r", prompt)])
    new, drafted, accepted = out[:], 0, 0
    while len(out) < NUM_TOKENS:
        tree = draft.speculate([SpecItem("r", new, chain_len=CHAIN_LEN)])[0]
        result = target.verify([VerifyItem("r", tree)])[0]
        drafted += len(tree)
        accepted += len(result.accepted_nodes)
        out += result.tokens
        new = result.tokens
    assert out[:NUM_TOKENS] == reference[:NUM_TOKENS]

    hf_model = load_causal_lm(SOURCES[TARGET], with_tokenizer=False).model  # a runner rewires its model's attention
    with torch.inference_mode():  # and both equal transformers' own greedy decoding
        hf = hf_model.generate(torch.tensor([prompt]), max_new_tokens=NUM_TOKENS, do_sample=False)
    assert hf[0, len(prompt) :].tolist() == reference[:NUM_TOKENS]
    assert accepted / drafted >= 0.4, (accepted, drafted)  # committed weights: 38 of 40 at k=4


def test_registry_copies_the_committed_pair(tmp_path):
    from rich.console import Console

    done = registry.prepare(registry.get_pair("tiny-trained"), Paths.resolve(tmp_path), Console(quiet=True))
    assert set(done) == {"target", "draft"} and all(is_prepared(p) for p in done.values())
    assert (done["draft"] / "tokenizer.json").read_bytes() == (SOURCES[DRAFT] / "tokenizer.json").read_bytes()
