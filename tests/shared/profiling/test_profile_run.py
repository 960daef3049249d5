"""`tandem profile --pair tiny --quick` for real: the tiny target's verify forwards, stored on disk and in Redis."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from sdk.cli import app
from shared.profiling.cost_model import find_profile, load_profile, redis_blob_name
from shared.profiling.measure import measure


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    from shared.models.tiny import save_tiny

    home = tmp_path_factory.mktemp("home")
    save_tiny(home / "models" / "tiny-target", "llama", num_layers=2, seed=0)  # what the tiny pair's target is
    return home


def test_quick_profile_of_the_tiny_target_is_stored_under_home_and_in_redis(home, tmp_path):
    from shared.state.redis_server import start_redis
    from shared.state.store import StateStore, StoreConfig

    redis = start_redis()
    try:
        out = tmp_path / "copy.json"
        args = ["profile", "--pair", "tiny", "--quick", "--home", str(home), "--device", "cpu", "--out", str(out),
                "--redis-url", redis.url]  # fmt: skip
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        assert "B = " in result.output

        path = find_profile(home, "tiny-target")
        assert path is not None and path.parent == home / "profiles" / "tiny-target"
        profile = load_profile(path)
        assert profile.model == "tiny-target" and profile.device == "cpu" and profile.dtype == "float32"
        assert profile.hardware.startswith("cpu ")
        assert 1 <= profile.token_budget <= 32 and profile.token_budget == profile.knee.budget
        assert [n for n, _ in profile.sweep] == [1, 4, 8, 16, 32]  # the quick grid, every size measured
        assert all(t > 0 for _, t in profile.sweep)
        contexts = {s.num_context_tokens for s in profile.samples}
        assert len(contexts) > 1  # the context sweep ran: the cost model sees context vary
        cm = profile.cost_model
        assert cm.alpha_s >= 0 and cm.gamma_s >= 0 and cm.predict(100, 8) > 0
        assert load_profile(out) == profile

        with StateStore(StoreConfig(url=redis.url)) as store:
            blob = store.get_json(redis_blob_name("tiny-target"))
        assert blob is not None and blob["token_budget"] == profile.token_budget

        again = CliRunner().invoke(app, ["profile", "--pair", "tiny", "--home", str(home), "--device", "cpu",
                                         "--if-missing"])  # fmt: skip
        assert again.exit_code == 0 and "already profiled" in again.output
        assert load_profile(path) == profile  # untouched
    finally:
        redis.stop()


def test_measure_leaves_the_runner_as_it_found_it(home):
    from shared.engine.factory import build_target_engine

    engine, loaded = build_target_engine(home / "models" / "tiny-target", device="cpu", dtype="float32",
                                         with_tokenizer=False)  # fmt: skip
    runner = engine.runner
    free = runner.cache.num_free_blocks
    profile = measure(runner, model=loaded.name, grid=(1, 2, 8), context_grid=(2,), num_seqs=2, short_context=8,
                      long_context=24, repeats=2)  # fmt: skip
    # 2 repeats x 3 sizes, 2 repeats x 2 x (decode, verify) pairs, 2 repeats x 1 size; the batch split
    # never exceeds the sequences
    assert len(profile.samples) == 6 + 8 + 2
    assert [s.num_batched_tokens for s in profile.samples[:3]] == [1, 2, 8]
    assert [s.num_seqs for s in profile.samples[:3]] == [1, 2, 2]
    pairs = [(s.num_seqs, s.num_batched_tokens) for s in profile.samples[6:14]]
    assert pairs == [(1, 1), (1, 2), (2, 2), (2, 4)] * 2  # plain decode, then one drafted token per sequence
    assert {s.num_context_tokens for s in profile.samples[14:]} != {s.num_context_tokens for s in profile.samples[:6]}
    assert not runner.seqs and runner.cache.num_free_blocks == free  # every sequence released, no block leaked
    runner.check_accounting()


def test_draft_flag_profiles_the_pairs_draft(home):
    from shared.models.tiny import save_tiny

    save_tiny(home / "models" / "tiny-draft", "llama", num_layers=1, seed=1)  # what the tiny pair's draft is
    args = ["profile", "--pair", "tiny", "--draft", "--quick", "--home", str(home), "--device", "cpu"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    path = find_profile(home, "tiny-draft")
    assert path is not None and path.parent == home / "profiles" / "tiny-draft"
    assert load_profile(path).model == "tiny-draft"


def test_a_feature_draft_is_not_profiled_alone_and_says_why(home, tmp_path):
    from shared.models.tiny import save_tiny_eagle

    head = save_tiny_eagle(tmp_path / "head", home / "models" / "tiny-target", draft_vocab_size=64)
    args = ["profile", "--model", str(head), "--draft", "--home", str(home), "--device", "cpu", "--quick"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1 and "feature-level draft" in result.output, result.output
    again = CliRunner().invoke(app, [*args, "--if-missing"])  # what `make bench-adaptive` runs: nothing to do
    assert again.exit_code == 0 and "fit its cost online" in again.output.replace("\n", " "), again.output
    assert find_profile(home, head.name) is None
