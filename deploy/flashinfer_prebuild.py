"""Compiles, at image build time, the flashinfer kernels Tandem's flashinfer backend loads
(shared/engine/attention/flashinfer_backend.py: paged batch prefill with causal and custom tree masks,
fp16/bf16, head dims 64/128/256), for every compute capability in FLASHINFER_CUDA_ARCH_LIST.

flashinfer's own AOT builder (`python -m flashinfer.aot`) writes them into its JIT workspace under
FLASHINFER_WORKSPACE_BASE, where the runtime JIT finds them built and up to date: no request ever waits
for nvcc. Needs nvcc (a CUDA *devel* base image), not a GPU. Only attention: no MoE, GEMM or
communication kernels, which Tandem does not use.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HEAD_DIMS = ["64,64", "128,128", "256,256"]  # SUPPORTED_HEAD_DIMS of the flashinfer backend, qk = vo
OFF = ["comm", "gemma", "oai-oss", "moe", "act", "misc", "xqa"]


def main() -> int:
    archs = os.environ.get("FLASHINFER_CUDA_ARCH_LIST")
    if not archs:
        print("FLASHINFER_CUDA_ARCH_LIST is unset: which GPUs to compile for?", file=sys.stderr)
        return 2
    cmd = [sys.executable, "-m", "flashinfer.aot", "--fa2-head-dim", *HEAD_DIMS,
           # Hopper's FA3 kernels only when a 9.0a target is asked for
           *(["--fa3-head-dim", *HEAD_DIMS] if "9.0a" in archs.split() else []),
           "--f16-dtype", "float16", "bfloat16", "--use-sliding-window", "false", "--use-logits-soft-cap", "false",
           *[arg for name in OFF for arg in (f"--add-{name}", "false")]]
    print("flashinfer AOT for", archs, ":", " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, check=True)
    import flashinfer.jit.env as jit_env

    built = sorted(Path(jit_env.FLASHINFER_JIT_DIR).rglob("*.so"))
    if not built:
        print(f"no kernel was built under {jit_env.FLASHINFER_JIT_DIR}", file=sys.stderr)
        return 1
    print(f"{len(built)} kernels under {jit_env.FLASHINFER_JIT_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
