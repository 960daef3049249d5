"""bench.diagnostics.verify_cost_by_dtype on a tiny target: a median per chain length, and the probe's sequence released."""

from bench.diagnostics.verify_cost_by_dtype import verify_ms
from shared.engine.factory import build_target_engine
from tests.support.tiny_stack import save_tiny_pair


def test_verify_ms_measures_every_chain_length_and_releases_its_sequence(tmp_path):
    target, _ = save_tiny_pair(tmp_path / "models")
    engine, _ = build_target_engine(target, dtype="float32")
    ms = verify_ms(engine, [0, 2], steps=6)
    assert set(ms) == {0, 2} and all(v > 0 for v in ms.values())
    assert verify_ms(engine, [1], steps=6)[1] > 0  # "probe" was released: a second prefill of it is accepted
