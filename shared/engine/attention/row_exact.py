"""Row-exact attention on CPU: each query row over exactly the KV it sees, in float32, with no mask.

    out = attend_rows(query, keys, values, row_slots, scaling)
    # query [1, H, T, D]; keys/values [N, Hkv, D] (one sequence's KV in position order)
    # row_slots[t]: n (the first n positions) or a LongTensor of positions (a tree row: prefix + ancestors)

Why per row (sdpa.py's docstring has the long form): a verify's row at position
p must compute what a plain decode at p computes, bit for bit, or greedy
speculative output drifts from plain decoding in 16-bit dtypes. Every row here
runs the very same ops on operands of the very same shapes and strides as a
one-row decode over those n positions would (q row contiguous [Hkv, rep, D],
K/V the first n rows of a contiguous [N, Hkv, D] or an index_select of it):
a row's result cannot depend on how many other rows the forward carries.

Why not one SDPA call per row (what this replaced): torch's CPU SDPA kernel
costs 60-300 us per one-row call at these sizes (~9 heads of 64, 60-600
positions; a fixed setup, then a GQA path that gets slower with the context),
2-4x the three small ops below. With 30 layers and 1-5 rows per step that was
2-25 ms of a ~20 ms decode step, and most of what made verifying k tokens cost
more than decoding one (bench/results/faser-eagle: verify 28.6 ms for 5 rows
against 19.3 ms for one).

Scores, softmax and the weighted sum run in float32, as the SDPA kernel does
internally for 16-bit inputs; the output is rounded to the query's dtype once. Per row that
is three kernels (baddbmm with the scaling as alpha, softmax, matmul into the output row),
~23 us on this project's CPU; 30 layers of three rows are ~2.7 ms of a k = 2 verify.

A tree row sees the first p positions (the context, and the path's nodes as far as they follow it in
order) and then a few ancestors further on. Gathering all n positions into a fresh tensor per row and
layer copied the whole context once per tree row: on a 1,024-token context a 15-node tree verified
in 210 ms against a 15-node chain's 130, now in 143 (bench/results/tree-verify; bf16, 2 cores). Instead the row's ancestors are
written in place behind its prefix, into the float32 copy every row reads anyway, and put back from
the 16-bit keys after the row (the conversion is exact either way): the row then reads the first n
rows of a contiguous [N, Hkv, D] tensor, the very layout a decode over those n positions reads, and
each tree row copies only its own few ancestors.
"""

from __future__ import annotations

import torch


RowSlots = int | torch.Tensor | tuple[int, torch.Tensor]


def split_row(seen: torch.Tensor) -> int | tuple[int, torch.Tensor]:
    """A row's visible positions (sorted) as their count when they are the first ones (0 … n-1), else as
    (p, tail): the first p positions, then the positions ``tail`` (each past p)."""
    n = int(seen.numel())
    if n == 0 or int(seen[-1]) == n - 1:
        return n
    p = int((seen == torch.arange(n, device=seen.device)).cumprod(0).sum())
    return p, seen[p:]


def attend_rows(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    row_slots: list[RowSlots],
    scaling: float,
) -> torch.Tensor:
    """query [1, H, T, D], keys / values [N, Hkv, D] → [1, T, H, D]; row t sees ``row_slots[t]`` only: the
    first n positions (an int), or (p, tail) as ``split_row`` makes it, or the sorted positions themselves."""
    _, num_heads, num_rows, head_dim = query.shape
    num_kv = keys.shape[1]
    rep = num_heads // num_kv  # query heads per KV head (grouped-query attention: repeat_interleave order)
    rows = [split_row(seen) if isinstance(seen, torch.Tensor) else seen for seen in row_slots]
    kf, vf = keys.float(), values.float()  # [N, Hkv, D]
    if any(not isinstance(seen, int) for seen in rows):  # tree rows write into kf / vf: never into the caller's
        kf = kf.clone() if kf.data_ptr() == keys.data_ptr() else kf
        vf = vf.clone() if vf.data_ptr() == values.data_ptr() else vf
    kt_all, vt_all = kf.permute(1, 2, 0), vf.transpose(0, 1)  # [Hkv, D, N], [Hkv, N, D]: views, made once
    # [T, Hkv, rep, D], contiguous: every row's q has one layout whatever T is
    q = query[0].float().view(num_kv, rep, num_rows, head_dim).permute(2, 0, 1, 3).contiguous()
    out = torch.empty(num_rows, num_kv, rep, head_dim, dtype=torch.float32, device=query.device)
    ignored = q.new_zeros(())  # baddbmm's input, unread with beta = 0
    for t, seen in enumerate(rows):
        if isinstance(seen, int):  # the first `seen` positions (a chain's rows, a decode): views, no copy
            n, p = seen, None
        else:  # a tree row: its ancestors moved in behind its prefix (module docstring), put back below
            p, tail = seen
            n = p + int(tail.numel())
            kf[p:n], vf[p:n] = kf.index_select(0, tail), vf.index_select(0, tail)
        kt, vt = kt_all[:, :, :n], vt_all[:, :n]
        # scaling inside the product and the result written in place: the same values as
        # matmul(...) * scaling and a copy into out[t] (tests/shared/engine/test_matmul_attention.py), two ops fewer
        scores = torch.baddbmm(ignored, q[t], kt, beta=0.0, alpha=scaling)  # [Hkv, rep, n]
        torch.matmul(torch.softmax(scores, dim=-1), vt, out=out[t])  # [Hkv, rep, D]
        if p is not None:
            kf[p:n], vf[p:n] = keys[p:n], values[p:n]  # exact: the 16-bit values widen to float32 unchanged
    return out.view(num_rows, num_heads, head_dim).to(query.dtype)[None]
