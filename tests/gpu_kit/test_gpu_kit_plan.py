"""The GPU kit's plan, dry-run on a CPU (offline, seconds): what is carried, how it is cut, the calls.

A whole round trip with synthetic wheels and a synthetic blob: build the loads under a call limit,
carry them one call at a time into a fake machine's staging directory, reassemble, install offline
(pip --no-index into a temporary site), and the commands and their dry runs. Nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from bench.gpu import bench, check, kit

REPO = Path(__file__).resolve().parents[2]


def make_wheel(folder: Path, name: str, version: str, requires: list[str] = (), pad: int = 0) -> Path:
    """A minimal pure-Python wheel: one module, METADATA with Requires-Dist, optional padding bytes."""
    dist = f"{name.replace('-', '_')}-{version}"
    path = folder / f"{dist}-py3-none-any.whl"
    module = name.replace("-", "_")
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    files = {
        f"{module}/__init__.py": f"VERSION = {version!r}\n",
        f"{module}/pad.bin": os.urandom(pad),
        f"{dist}.dist-info/METADATA": meta,
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{n},,\n" for n in files) + f"{dist}.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        for n, data in files.items():
            zf.writestr(n, data)
        zf.writestr(f"{dist}.dist-info/RECORD", record)
    return path


@pytest.fixture
def kit_env(tmp_path, monkeypatch):
    """A kit directory with three synthetic wheels and a 300 kB blob, and a fake machine's locations."""
    kit_dir = tmp_path / "here" / ".gpu-kit"
    wheels = kit_dir / "wheels"
    wheels.mkdir(parents=True)
    make_wheel(wheels, "alpha-pkg", "1.0", ["numpy>=1.0", "beta-pkg==2.0"], pad=60_000)
    make_wheel(wheels, "beta-pkg", "2.0", ["typing-extensions; python_version >= '3.8'"], pad=120_000)
    make_wheel(wheels, "gamma-pkg", "0.1", ['tomli; python_version < "3.11"'], pad=10_000)
    blob = tmp_path / "model.gguf"
    blob.write_bytes(os.urandom(300_000))
    monkeypatch.setenv("TANDEM_GPU_STAGE", str(tmp_path / "machine" / "stage"))
    monkeypatch.setenv(kit.SITE_ENV, str(tmp_path / "machine" / "site"))
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "machine" / "home"))
    return kit_dir, [kit.Blob("model.gguf", "downloads/model.gguf", str(blob))], blob


def build_small(kit_dir, blobs, load_budget=200_000):
    """A build whose loads hold ``load_budget`` bytes: the 'tree' fills the rest of a call."""
    tree = kit.CALL_LIMIT_BYTES - kit.MANIFEST_RESERVE_BYTES - load_budget
    return kit.build(kit_dir, blobs=blobs, headroom=0, tree=tree, download=False, log=lambda _: None)


# ----------------------------------------------------------------------------- what is carried


def test_every_tandem_dependency_is_in_the_image_or_carried():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    deps = project["dependencies"] + project["optional-dependencies"]["gpu"]
    carried = {kit.normalize(w.name) for w in kit.CARRIED_WHEELS}
    for dep in deps:
        name = kit.normalize(re.split(r"[<>=!~;\[ ]", dep, maxsplit=1)[0])
        assert name in kit.GPU_IMAGE_PACKAGES or name in carried, f"{dep}: neither in the GPU image nor carried"
    assert {"flashinfer-python", "apache-tvm-ffi", "grpcio", "grpcio-tools", "protobuf"} <= carried
    assert len({kit.normalize(w.name) for w in kit.CARRIED_WHEELS}) == len(kit.CARRIED_WHEELS)  # one version each


def test_unmet_requirements_are_reported(tmp_path):
    ok = make_wheel(tmp_path, "ok-pkg", "1.0", ["numpy>=1.0", "torch>=2.5", "nvidia-cutlass-dsl>=4"])
    assert kit.unmet_requirements([ok]) == []  # image packages; a deliberately uncarried one
    bad = make_wheel(tmp_path, "bad-pkg", "1.0", ["no-such-package>=1", "transformers>=9", "ok-pkg>=2",
                                                  "skipped-pkg; python_version < '3.0'", "extra-only; extra == 'x'"])  # fmt: skip
    unmet = kit.unmet_requirements([ok, bad])
    assert len(unmet) == 3, unmet
    assert any("no-such-package" in u for u in unmet)
    assert any("image has 5.17.0" in u for u in unmet)
    assert any("carried 1.0" in u for u in unmet)


def test_cut_loads_keeps_wheels_whole_and_cuts_blobs_in_order():
    wheels = [("a.whl", 70), ("b.whl", 40), ("c.whl", 30)]
    loads = kit.cut_loads(wheels, [("m", 250)], capacity=100)
    assert all(ld.bytes <= 100 for ld in loads)
    placed = [p for ld in loads for p in ld.parts]
    assert sorted(p.file for p in placed if p.file.endswith(".whl")) == ["a.whl", "b.whl", "c.whl"]
    parts = sorted((p for p in placed if p.of == "m"), key=lambda p: p.index)
    assert sum(p.bytes for p in parts) == 250 and [p.index for p in parts] == list(range(len(parts)))
    assert len(loads) == 4  # 140 of wheels + 250 of blob = 390 bytes in loads of 100
    with pytest.raises(ValueError, match="does not fit"):
        kit.cut_loads([("huge.whl", 101)], [], capacity=100)
    with pytest.raises(ValueError, match="no room"):
        kit.cut_loads([], [("m", 1)], capacity=0)


def test_calls_stage_every_load_but_the_last_then_check_and_bench():
    steps = kit.calls(["load-1", "load-2", "load-3"])
    assert [c["step"] for c in steps] == ["stage", "stage", "check", "bench"]
    assert [c["carry"] for c in steps] == [[".gpu-kit/load-1"], [".gpu-kit/load-2"], [".gpu-kit/load-3"],
                                           [".gpu-kit/load-3"]]  # fmt: skip
    assert all(c["timeout_s"] <= 600 and len(c["command"]) <= 2000 for c in steps)
    assert steps[2]["command"].endswith("python3 -m bench.gpu check") and steps[2]["make"] == "make gpu-check"
    assert steps[3]["command"].endswith("python3 -m bench.gpu bench") and steps[3]["make"] == "make gpu-bench"


# ----------------------------------------------------------------------------- build, carry, stage, set up


def test_build_cuts_loads_that_fit_a_call_and_prints_the_calls(kit_env):
    kit_dir, blobs, blob = kit_env
    plan = build_small(kit_dir, blobs)
    manifest = json.loads((kit_dir / kit.MANIFEST).read_text())
    assert plan["kit_id"] == manifest["kit_id"]
    assert len(plan["loads"]) == len(manifest["loads"]) >= 3
    for load in plan["loads"]:
        folder = kit_dir / load["name"]
        assert sorted(p.name for p in folder.iterdir()) == sorted(load["files"])  # each carry path exists, whole
        assert sum(p.stat().st_size for p in folder.iterdir()) == load["bytes"]
        assert load["bytes"] <= plan["load_budget_bytes"] + kit.MANIFEST_RESERVE_BYTES
    assert kit.check_plan(plan) == []
    assert kit.check_plan(plan, tree=plan["tree_bytes"] + 1_000_000)  # the tree grew: rebuild the kit
    text = kit.format_plan(plan)
    for c in plan["calls"]:
        assert json.dumps(c["carry"]) in text and json.dumps(c["command"]) in text
    assert "make gpu-check" in text and "make gpu-bench" in text
    # parts are byte ranges of the blob, in order
    parts = sorted((p for ld in manifest["loads"] for p in ld["files"] if p["of"] == "model.gguf"),
                   key=lambda p: p["index"])  # fmt: skip
    joined = b"".join((kit_dir / ld["name"] / p["file"]).read_bytes() for p in parts
                      for ld in manifest["loads"] if p in ld["files"])  # fmt: skip
    assert joined == blob.read_bytes()


def test_unmet_requirement_stops_the_build(kit_env):
    kit_dir, blobs, _ = kit_env
    make_wheel(kit_dir / "wheels", "delta-pkg", "1.0", ["not-in-the-image>=1"])
    with pytest.raises(RuntimeError, match="not-in-the-image"):
        build_small(kit_dir, blobs)


def carry(kit_dir: Path, machine_repo: Path, load: str) -> Path:
    """What a device call does with carry=[.gpu-kit/<load>]: that path, and only it, replaced on the machine."""
    dst = machine_repo / ".gpu-kit" / load
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(kit_dir / load, dst)
    return machine_repo / ".gpu-kit"


def test_loads_staged_call_by_call_then_setup_installs_offline(kit_env, tmp_path):
    kit_dir, blobs, blob = kit_env
    plan = build_small(kit_dir, blobs)
    loads = [ld["name"] for ld in plan["loads"]]
    machine = tmp_path / "machine" / "repo"
    with pytest.raises(kit.NotStaged):  # a fresh machine, nothing carried
        kit.setup(machine / ".gpu-kit", pairs=(), log=lambda _: None)
    for i, load in enumerate(loads[:-1]):
        status = kit.stage(carry(kit_dir, machine, load), log=lambda _: None)
        assert status["staged"] == loads[: i + 1] and status["missing"] == loads[i + 1 :]
    with pytest.raises(kit.NotStaged, match=loads[-1]):
        kit.setup(machine / ".gpu-kit", pairs=(), log=lambda _: None)
    done = kit.setup(carry(kit_dir, machine, loads[-1]), pairs=(), log=lambda _: None)
    assert done["kit_id"] == plan["kit_id"]
    home = Path(os.environ["TANDEM_HOME"])
    assert (home / "downloads" / "model.gguf").read_bytes() == blob.read_bytes()
    site = kit.site_dir()
    env = kit.site_env()
    out = subprocess.run([sys.executable, "-c", "import alpha_pkg, beta_pkg, gamma_pkg; print(beta_pkg.VERSION)"],
                         env=env, capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    assert out.stdout.strip() == "2.0", out.stderr
    assert env["PYTHONPATH"].split(os.pathsep)[:2] == [str(site), str(kit.REPO_ROOT)]
    # idempotent: a second call (the bench after the check) re-stages nothing and reinstalls nothing
    marker = next(site.glob(".tandem-kit-*"))
    before = marker.stat().st_mtime_ns
    kit.setup(machine / ".gpu-kit", pairs=(), log=lambda _: None)
    assert marker.stat().st_mtime_ns == before


def test_a_corrupted_part_is_refused(kit_env, tmp_path):
    kit_dir, blobs, _ = kit_env
    plan = build_small(kit_dir, blobs)
    load = plan["loads"][-1]["name"]
    machine_kit = carry(kit_dir, tmp_path / "m2", load)
    part = next(p for p in (machine_kit / load).iterdir() if p.name != kit.MANIFEST)
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0xFF
    part.write_bytes(bytes(data))
    with pytest.raises(kit.KitError, match="sha256"):
        kit.stage(machine_kit, log=lambda _: None)


def test_an_older_kit_left_on_the_machine_is_ignored(kit_env, tmp_path):
    kit_dir, blobs, _ = kit_env
    old = build_small(kit_dir, blobs)
    machine = tmp_path / "m3"
    carry(kit_dir, machine, old["loads"][0]["name"])
    new = build_small(kit_dir, blobs)  # rebuilt: new kit id
    assert new["kit_id"] != old["kit_id"]
    status = kit.stage(carry(kit_dir, machine, new["loads"][1]["name"]), log=lambda _: None)
    assert status["kit_id"] == new["kit_id"] and status["staged"] == [new["loads"][1]["name"]]


def test_tree_bytes_counts_what_a_call_sends():
    """With what docs/gpu.md moves aside for the calls, the tree fits one call; the aside folders count."""
    size = kit.tree_bytes(leave_out=kit.GPU_ASIDE)
    assert 1_000_000 < size < kit.CALL_LIMIT_BYTES
    assert kit.tree_bytes() > size + 1_000_000


# ----------------------------------------------------------------------------- the two GPU commands


def test_check_plan_names_existing_modules_and_tests(tmp_path):
    stages = check.plan_stages(tmp_path)
    assert [s.name for s in stages] == ["device", "tests-gpu", "tests-cuda"]
    assert importlib.util.find_spec("bench.gpu.device") is not None
    assert "-m" in stages[1].cmd and "gpu" in stages[1].cmd and stages[1].cmd[-1] == "tests"
    for node in check.CUDA_AWARE_TESTS:
        path, _, func = node.partition("::")
        assert (REPO / path).is_file(), node
        if func:
            assert f"def {func}(" in (REPO / path).read_text(), node
    for path in check.NOT_COLLECTED:  # left out of `pytest -m gpu`: it must exist and hold no GPU test
        assert (REPO / path).is_file() and "mark.gpu" not in (REPO / path).read_text(), path
        assert f"--ignore={path}" in stages[1].cmd
    assert sum(s.min_s for s in stages) + check.WARM_BUDGET_S < check.DEADLINE_S < 600
    gpu_tests = list((REPO / "tests" / "gpu").glob("test_*.py"))
    assert len(gpu_tests) >= 3
    for path in gpu_tests:  # every GPU test is marked, so `pytest -m gpu` selects it
        assert "pytest.mark.gpu" in path.read_text(), path


def test_bench_plan_budgets_and_modules(tmp_path):
    stages = bench.plan_stages(tmp_path)
    names = [s.name for s in stages]
    assert names == ["device", "warm", "verify_curve", "decode", "faser", "sm_split", "slo"]
    for s in stages:
        assert importlib.util.find_spec(s.cmd[2]) is not None, s.cmd
        assert s.min_s <= s.budget_s and s.result
    assert sum(s.min_s for s in stages if s.name in ("device", "warm", "verify_curve", "decode")) < bench.DEADLINE_S
    assert bench.DEADLINE_S < 600
    assert bench.rerun_command([{"name": "slo", "status": "skipped"}, {"name": "decode", "status": "ok"},
                                {"name": "faser", "status": "timeout"}]) == \
        "PYTHONUNBUFFERED=1 python3 -m bench.gpu bench --stages slo,faser"  # fmt: skip
    assert bench.rerun_command([{"name": "decode", "status": "ok"}]) is None
    assert bench.rerun_command([{"name": "slo", "status": "timeout"}], attention="sdpa") == \
        "PYTHONUNBUFFERED=1 python3 -m bench.gpu bench --stages slo --attention sdpa"  # fmt: skip


@pytest.mark.parametrize("command", [["check", "--dry-run"], ["bench", "--dry-run"], ["bench", "--dry-run",
                                                                                      "--stages", "slo"],
                                     ["bench", "--dry-run", "--stages", "slo", "--attention", "sdpa"]])
def test_dry_runs_print_the_stages(command):
    out = subprocess.run([sys.executable, "-m", "bench.gpu", *command], cwd=REPO, capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    stages = json.loads(out.stdout)
    assert stages and all({"name", "cmd", "budget_s", "min_s"} <= s.keys() for s in stages)
    if "--attention" in command:  # SDPA services: no flashinfer compile to wait for
        assert [s["name"] for s in stages] == ["device", "slo"]
    elif "--stages" in command:
        assert [s["name"] for s in stages] == ["device", "warm", "slo"]


def test_gpu_side_modules_import_with_the_standard_library_only():
    """kit, check, bench, budget, results run on the machine before the wheels are installed."""
    code = ("import sys; import bench.gpu.kit, bench.gpu.check, bench.gpu.bench, bench.gpu.budget, "
            "bench.gpu.results, bench.gpu.agreement, bench.gpu.__main__; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'pydantic', 'grpc', 'transformers', 'numpy', 'rich', 'typer', 'packaging')); print(bad)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_makefile_targets_run_the_kit():
    text = (REPO / "Makefile").read_text()
    for target, command in (("gpu-kit", "bench.gpu build"), ("gpu-check", "bench.gpu check"),
                            ("gpu-bench", "bench.gpu bench")):  # fmt: skip
        body = re.search(rf"^{target}:.*\n((?:\t.*\n)+)", text, re.M)
        assert body and command in body.group(1), target


def test_sha256_matches_hashlib(tmp_path):
    p = tmp_path / "x"
    p.write_bytes(b"tandem" * 1000)
    assert kit.sha256(p) == hashlib.sha256(p.read_bytes()).hexdigest()
