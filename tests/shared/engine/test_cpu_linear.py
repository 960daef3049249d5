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
    model = nn.Sequential(nn.Linear(16, 16)).to(torch.float16)
    assert prepack(model) == 0
    assert type(model[0]) is nn.Linear


def test_prepack_packs_bf16_where_the_cpu_multiplies_it_natively():
    from shared.engine import cpu_linear

    model = nn.Sequential(nn.Linear(16, 16)).to(torch.bfloat16)
    packed = prepack(model, min_rows=1)
    assert packed == (1 if cpu_linear.bf16_supported() else 0)
    if packed:
        x = torch.randn(3, 16, dtype=torch.bfloat16)
        with torch.no_grad():
            assert torch.allclose(model(x).float(), F.linear(x, model[0].weight, model[0].bias).float(), atol=2e-2, rtol=2e-2)


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


def _stub_timer(monkeypatch, mkl_faster_at):
    """Make calibrate_min_rows see MKL faster exactly at the row counts in ``mkl_faster_at``."""
    seen = {}

    def fake_median_time(fn, repeats):
        rows = seen["rows"]
        path = fn.__name__
        return (1.0 if path == "mkl" else 2.0) if rows in mkl_faster_at else (2.0 if path == "mkl" else 1.0)

    real_randn = torch.randn

    def spy_randn(*shape, **kw):
        seen["rows"] = shape[0]
        return real_randn(*shape, **kw)

    monkeypatch.setattr(cpu_linear, "_median_time", fake_median_time)
    monkeypatch.setattr(cpu_linear.torch, "randn", spy_randn)


@pytest.mark.parametrize(
    ("mkl_faster_at", "expected"),
    [(set(), 1), ({1}, 2), ({1, 2, 3}, 4), ({1, 2, 3, 4}, 5), ({2}, 3)],
)
def test_calibrate_min_rows_starts_the_packed_path_after_the_last_row_count_mkl_won(
    monkeypatch, mkl_faster_at, expected
):
    layers = [PackedLinear(nn.Linear(16, 8)) for _ in range(3)]
    _stub_timer(monkeypatch, mkl_faster_at)
    assert cpu_linear.calibrate_min_rows(layers) == expected


def test_calibrate_min_rows_times_both_paths_on_a_bounded_sample(monkeypatch):
    layers = [PackedLinear(nn.Linear(64, 64)) for _ in range(10)]  # 16 KiB of weights each
    calls = []
    real = PackedLinear.packed_forward

    def spy(self, x):
        calls.append(self)
        return real(self, x)

    monkeypatch.setattr(PackedLinear, "packed_forward", spy)
    got = cpu_linear.calibrate_min_rows(layers, max_rows=2, repeats=1, sample_bytes=3 * 64 * 64 * 4)
    assert 1 <= got <= 3
    assert set(map(id, calls)) == set(map(id, layers[:3]))  # only the sampled layers were timed


def test_prepack_measures_min_rows_unless_told(monkeypatch):
    monkeypatch.setattr(cpu_linear, "calibrate_min_rows", lambda layers: 2)
    measured = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16))
    assert prepack(measured) == 2
    assert [m.min_rows for m in measured] == [2, 2]

    told = nn.Sequential(nn.Linear(16, 16))
    monkeypatch.setattr(cpu_linear, "calibrate_min_rows", lambda layers: pytest.fail("told, not measured"))
    assert prepack(told, min_rows=3) == 1
    assert told[0].min_rows == 3


def test_runner_takes_min_rows_from_the_engine_config(tiny_model_dir):
    from shared.engine.factory import build_target_engine

    engine, _ = build_target_engine(
        tiny_model_dir, device="cpu", dtype="float32", with_tokenizer=False,
        engine_config=EngineConfig(num_blocks=64, cpu_prepack_min_rows=2),
    )
    running = engine.runner.weight_modules[-1]  # the fused decoder and LM head, or the model itself
    packed = [m for m in running.modules() if isinstance(m, PackedLinear)]
    assert packed and {m.min_rows for m in packed} == {2}
