"""`tandem profile --shares --pair tiny --quick` for real: both tiny models at 1 and 2 threads, read back by the
launcher's ``draft_share="auto"``; the CUDA MPS path where there is a GPU."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from sdk.cli import app
from services.launcher import LaunchConfig, resolve_share, resource_env
from shared.profiling.sm_share import load_share_profile, share_hardware, share_profile_path

MODELS = {"draft": "tiny-draft", "target": "tiny-target"}


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    from shared.models.tiny import save_tiny

    home = tmp_path_factory.mktemp("home")
    save_tiny(home / "models" / "tiny-target", "llama", num_layers=2, seed=0)  # the tiny pair, as the registry makes it
    save_tiny(home / "models" / "tiny-draft", "llama", num_layers=1, seed=1)
    return home


def test_quick_share_profile_of_the_tiny_pair_feeds_draft_share_auto(home):
    args = ["profile", "--shares", "--pair", "tiny", "--quick", "--home", str(home), "--device", "cpu",
            "--threads", "2"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    hardware = share_hardware(cores=2)
    for role, name in MODELS.items():
        path = share_profile_path(home, name, hardware)
        assert path.is_file(), result.output
        profile = load_share_profile(path)
        assert (profile.model, profile.role, profile.unit, profile.total) == (name, role, "threads", 2)
        assert sorted({s.share for s in profile.samples}) == [0.5, 1.0]  # 1 and 2 threads of 2 cores
        assert sorted({(s.b, s.s) for s in profile.samples}) == [(1, 1), (1, 3), (4, 1), (4, 3)]  # the quick grid
        assert all(s.duration_s > 0 for s in profile.samples)
        fitted = profile.draft if role == "draft" else profile.target
        assert fitted is not None and fitted.curve.factor(1.0) == pytest.approx(1.0)  # normalised at the whole machine
        assert fitted.predict(4, 3, 0.5) > 0

    again = CliRunner().invoke(app, args + ["--if-missing"])
    assert again.exit_code == 0 and "already share-profiled" in again.output

    config = LaunchConfig(pair="tiny", home=home, draft_share="auto")
    share, choice = resolve_share(config, home / "models" / "tiny-target", str(home / "models" / "tiny-draft"),
                                  on_cuda=False, cores=2)  # fmt: skip
    assert share == 0.5 and choice.grid == [0.5]  # two cores: one thread each is the only split
    assert choice.draft_profile == str(share_profile_path(home, "tiny-draft", hardware))
    env = resource_env(config.model_copy(update={"draft_share": share}), on_cuda=False, cores=2)
    assert env == {"draft": {"TANDEM_THREADS": "1"}, "target": {"TANDEM_THREADS": "1"}}


def test_shares_profile_a_pair_only(home):
    result = CliRunner().invoke(app, ["profile", "--shares", "--model", "x", "--home", str(home)])
    assert result.exit_code == 2 and "--shares profiles a pair" in result.output


def test_mps_percentages_on_cuda(home):
    """Written for a GPU; needs no MPS daemon (without one the percentages are simply not enforced)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from shared.profiling.measure_shares import profile_shares

    models = {role: home / "models" / name for role, name in MODELS.items()}
    profiles = profile_shares(models, device="cuda", percentages=(50, 100), batches=(1, 4), tokens=(1, 3),
                              context=16, repeats=1)  # fmt: skip
    gpu = torch.cuda.get_device_name(0)
    for role, profile in profiles.items():
        assert (profile.unit, profile.total, profile.hardware) == ("mps", 100, gpu)
        assert profile.device.startswith("cuda") and sorted({s.share for s in profile.samples}) == [0.5, 1.0]
