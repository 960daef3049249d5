"""oneDNN-prepacked linear layers: same products as F.linear, swapped in only where they pay."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from shared.engine import cpu_linear
from shared.engine.config import EngineConfig
from shared.engine.cpu_linear import PackedLinear, prepack

pytestmark = pytest.mark.skipif(
    not cpu_linear.available(torch.device("cpu"), torch.float32), reason="this torch has no oneDNN"
)


@pytest.mark.parametrize("rows", [1, 3, 4, 8, 33])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_matches_f_linear_at_every_row_count(rows, bias):
    torch.manual_seed(0)
    linear = nn.Linear(64, 96, bias=bias)
    packed = PackedLinear(linear)
    x = torch.randn(1, rows, 64)  # [1, T, hidden], as the decoder calls it
    with torch.inference_mode():
        got = packed(x)
    assert got.shape == (1, rows, 96)
    torch.testing.assert_close(got, F.linear(x, linear.weight, linear.bias), rtol=1e-5, atol=1e-5)


def test_packed_linear_uses_mkl_below_min_rows_and_onednn_from_there(monkeypatch):
    calls = []
    real = torch.ops.mkldnn._linear_pointwise

    class Spy:
        def __call__(self, *args):
            calls.append(args[0].shape[0])
            return real(*args)

    packed = PackedLinear(nn.Linear(16, 8), min_rows=4)
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", Spy())
    with torch.inference_mode():
        packed(torch.randn(3, 16))
        packed(torch.randn(2, 2, 16))
    assert calls == [4]


def test_prepack_keeps_tied_weights_and_the_state_dict():
    model = nn.Sequential(nn.Embedding(50, 16), nn.Linear(16, 16), nn.Linear(16, 50, bias=False))
    model[2].weight = model[0].weight  # tied LM head
    keys = set(model.state_dict())
    assert prepack(model) == 2
    assert isinstance(model[1], PackedLinear) and isinstance(model[2], PackedLinear)
    assert model[2].weight is model[0].weight
    assert set(model.state_dict()) == keys


def test_prepack_leaves_other_dtypes_alone():
    model = nn.Sequential(nn.Linear(16, 16)).to(torch.bfloat16)
    assert prepack(model) == 0
    assert type(model[0]) is nn.Linear


def test_runner_prepacks_on_cpu_and_its_greedy_tokens_do_not_change(tiny_model_dir):
    from shared.engine.factory import build_target_engine
    from shared.engine.runner import Work

    outputs = {}
    for flag in (False, True):
        engine, _ = build_target_engine(
            tiny_model_dir, device="cpu", dtype="float32", with_tokenizer=False,
            engine_config=EngineConfig(num_blocks=64, cpu_prepack=flag),
        )
        runner = engine.runner
        assert (runner.packed_linears > 0) == flag
        seqs = [runner.add(f"s{i}", [3 + i, 5, 7, 11, 13 + i]) for i in range(4)]
        out = runner.forward([Work(s) for s in seqs])  # 20 rows: the packed path
        logits = out.logits
        outputs[flag] = logits
    torch.testing.assert_close(outputs[True], outputs[False], rtol=1e-4, atol=1e-4)
    assert torch.equal(outputs[True].argmax(-1), outputs[False].argmax(-1))
