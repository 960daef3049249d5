"""Target features for feature-level drafts (EAGLE family): what crosses the service boundary, and how.

A feature row is the target's hidden states of ONE committed token at the
draft's aux layers, concatenated::

    row t = [ h_{l0}(t) | h_{l1}(t) | h_{l2}(t) ]      width = len(layer_ids) * hidden_size
            layer id i = the hidden state entering decoder layer i; i = num_layers: the last layer's
            output before the final norm

On the wire (``FeatureBlock`` in common.proto) rows travel as one packed,
little-endian, row-major byte string of ``num_rows x width`` values in the
draft's dtype, tagged with ``start``, the target position of the first row.
Only committed tokens' rows ever move: the target sends the rows of the
tokens a prefill or verify committed *and ran* (the bonus token is run, and
so gets its row, in the next step), the scheduler forwards them to the
draft with the same tokens, and the draft feeds row t with token t + 1.

This module is plain data plus (lazy) torch conversions, so the scheduler
can carry blocks without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass

ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4}


@dataclass(frozen=True)
class FeatureSpec:
    """What features the draft wants of the target: which layers, in which dtype."""

    layer_ids: tuple[int, ...]
    dtype: str = "float16"

    def __post_init__(self) -> None:
        if not self.layer_ids:
            raise ValueError("a feature spec needs at least one layer id")
        if self.dtype not in ITEMSIZE:
            raise ValueError(f"feature dtype {self.dtype!r}: use one of {sorted(ITEMSIZE)}")


@dataclass(frozen=True)
class FeatureBlock:
    """Consecutive feature rows of one sequence: rows for target positions start .. start + num_rows - 1."""

    start: int
    num_rows: int
    width: int
    dtype: str
    data: bytes
    # pushed: the rows past ``data`` (which then holds only the first len(data) // row_bytes of them) went from
    # the target straight to the draft (step streams, docs/services.md); the scheduler tracks positions only
    pushed: bool = False

    def __post_init__(self) -> None:
        if self.dtype not in ITEMSIZE:
            raise ValueError(f"feature dtype {self.dtype!r}: use one of {sorted(ITEMSIZE)}")
        if self.start < 0 or self.num_rows < 0 or self.width <= 0:
            raise ValueError(f"feature block: start {self.start}, rows {self.num_rows}, width {self.width}")
        if self.pushed and len(self.data) % self.row_bytes == 0 and len(self.data) <= self.num_rows * self.row_bytes:
            return
        if len(self.data) != self.num_rows * self.row_bytes:
            raise ValueError(
                f"feature block: {len(self.data)} bytes for {self.num_rows} rows of {self.width} {self.dtype} "
                f"(expected {self.num_rows * self.row_bytes})"
            )

    @property
    def row_bytes(self) -> int:
        return self.width * ITEMSIZE[self.dtype]

    @property
    def end(self) -> int:
        return self.start + self.num_rows

    @property
    def inline_rows(self) -> int:
        """Rows whose bytes this block carries (all of them unless pushed)."""
        return len(self.data) // self.row_bytes

    def rows(self, start: int, end: int) -> "FeatureBlock":
        """The rows for positions [start, end), which must lie inside this block."""
        if not (self.start <= start <= end <= self.end):
            raise ValueError(f"rows [{start}, {end}) outside the block's [{self.start}, {self.end})")
        a, b = (start - self.start) * self.row_bytes, (end - self.start) * self.row_bytes
        if self.pushed:  # the inline prefix that falls in [start, end); rows past it stay with the draft
            data = self.data[a:b] if a < len(self.data) else b""
            return FeatureBlock(start, end - start, self.width, self.dtype, data, pushed=True)
        return FeatureBlock(start, end - start, self.width, self.dtype, self.data[a:b])

    @staticmethod
    def join(blocks: list["FeatureBlock"]) -> "FeatureBlock | None":
        """Blocks of consecutive positions as one (a later block overrides the rows it shares with earlier ones)."""
        blocks = [b for b in blocks if b.num_rows]
        if not blocks:
            return None
        out = blocks[0]
        for b in blocks[1:]:
            if b.width != out.width or b.dtype != out.dtype:
                raise ValueError("cannot join feature blocks of different widths or dtypes")
            if not (out.start <= b.start <= out.end):
                raise ValueError(f"feature rows from {b.start} leave a gap after {out.end}")
            head = out.rows(out.start, b.start)
            # the earlier block's rows past b's end are dropped too: b is newer (the target re-ran from there)
            pushed = head.pushed or b.pushed
            whole = head.inline_rows == head.num_rows  # inline bytes stay a prefix: b's only follow a whole head
            data = head.data + b.data if whole else head.data
            out = FeatureBlock(out.start, head.num_rows + b.num_rows, out.width, out.dtype, data, pushed=pushed)
        return out

    def to_tensor(self, device=None):
        """[num_rows, width] tensor in the block's dtype (a copy: the bytes stay immutable)."""
        import torch

        dtype = getattr(torch, self.dtype)
        flat = torch.frombuffer(bytearray(self.data), dtype=dtype) if self.data else torch.empty(0, dtype=dtype)
        rows = flat.view(self.num_rows, self.width)
        # from pageable memory a non-blocking copy is staged at once (the bytes may go) and waits for no kernel
        return rows.to(device, non_blocking=True) if device is not None else rows

    @staticmethod
    def from_tensor(rows, start: int, dtype: str) -> "FeatureBlock":
        """rows [num_rows, width] → a block in ``dtype`` (the draft's wire dtype)."""
        import torch

        t = rows.detach().to("cpu", getattr(torch, dtype)).contiguous()
        data = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        return FeatureBlock(start, int(t.shape[0]), int(t.shape[1]), dtype, data)
