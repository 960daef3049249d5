"""The committed EAGLE-3 head for the demo target assembles in seconds, loads, and fits its target."""

from __future__ import annotations

import pytest
from rich.console import Console

from shared.models import smollm2_eagle
from shared.models.paths import Paths, is_prepared


def test_the_trained_head_is_committed_small_with_its_report():
    import json

    head = smollm2_eagle.WEIGHTS / "head.safetensors"
    assert head.is_file() and head.stat().st_size < 16 << 20  # fp16, no embedding, no LM head
    report = json.loads((smollm2_eagle.WEIGHTS / "report.json").read_text())
    assert report["heldout_k4"]["all"]["mean_accepted_length"] > 1.0
    assert "python -m shared.models.eagle" in report["command"]


def test_prepare_assembles_a_head_that_loads_over_the_prepared_target(tmp_path, smollm2_dir):
    import shutil

    from shared.engine.eagle.loading import load_head

    paths = Paths.resolve(tmp_path)
    paths.models.mkdir(parents=True)
    shutil.copytree(smollm2_dir, paths.model_dir("smollm2-135m-instruct"))  # no download: the prepared target
    out = smollm2_eagle.prepare(paths, Console(quiet=True))
    assert is_prepared(out)
    head = load_head(out, target_dir=smollm2_dir)
    assert head.cfg.aux_layer_ids == [2, 15, 30] and head.cfg.target_hidden_size == 576
    assert smollm2_eagle.prepare(paths, Console(quiet=True)) == out  # idempotent
    assert smollm2_eagle.prepared_digest(out) == smollm2_eagle.head_digest(smollm2_eagle.WEIGHTS / "head.safetensors")
    (out / "model.safetensors").write_bytes(b"stale")  # a copy assembled from an older head (its marker says so)
    marker = out / smollm2_eagle.PREPARED_MARKER
    marker.write_text(marker.read_text().replace(smollm2_eagle.prepared_digest(out), "0" * 40))
    smollm2_eagle.prepare(paths, Console(quiet=True))  # re-assembled from the committed head
    assert load_head(out, target_dir=smollm2_dir).cfg.target_hidden_size == 576
