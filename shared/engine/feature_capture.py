"""Record the target's hidden states at chosen layers during a forward, for feature-level drafts.

Hooks sit on the decoder layers (and the final norm for layer id N); they
record only while ``recording(layer_ids)`` is active, so a forward that wants
no features pays nothing. Layer id i is the hidden state *entering* decoder
layer i; i = N (the number of layers) is the last layer's output before the
final norm (see features.py).

Token-wise early exit runs the layers on a shrinking set of rows; it tells
the capture which packed rows are still running (``rows``), and the capture
scatters each recording back to the full [T, hidden] layout (rows that had
stopped stay zero; they are pruned tree nodes, never committed, so no
feature of theirs is ever sent).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from shared.engine.errors import InvalidRequestError


class FeatureCapture:
    def __init__(self, decoder) -> None:
        self.num_layers = len(decoder.layers)
        self.layer_ids: tuple[int, ...] = ()
        self.recorded: dict[int, torch.Tensor] = {}
        self.rows: torch.Tensor | None = None  # packed rows still running (early exit); None = all
        self.num_tokens = 0
        self.paused = False
        for i, layer in enumerate(decoder.layers):
            layer.register_forward_pre_hook(self._hook(i), with_kwargs=True)
        decoder.norm.register_forward_pre_hook(self._hook(self.num_layers), with_kwargs=True)

    def check(self, layer_ids: tuple[int, ...]) -> None:
        bad = [i for i in layer_ids if not 0 <= i <= self.num_layers]
        if bad or not layer_ids:
            raise InvalidRequestError(
                f"feature layers {list(layer_ids)}: each must be in 0..{self.num_layers} (the target has "
                f"{self.num_layers} decoder layers; {self.num_layers} = the last layer's output)"
            )

    def _hook(self, layer_id: int):
        def hook(module, args, kwargs):
            if layer_id not in self.layer_ids or self.paused:
                return None
            hidden = args[0] if args else kwargs["hidden_states"]
            hidden = hidden.reshape(-1, hidden.shape[-1])  # [T', hidden]
            if self.rows is not None and hidden.shape[0] != self.num_tokens:
                full = hidden.new_zeros(self.num_tokens, hidden.shape[-1])
                full[self.rows.to(hidden.device)] = hidden
                hidden = full
            self.recorded[layer_id] = hidden
            return None

        return hook

    @contextmanager
    def recording(self, layer_ids: tuple[int, ...], num_tokens: int):
        self.check(layer_ids)
        self.layer_ids, self.recorded, self.rows, self.num_tokens = tuple(layer_ids), {}, None, num_tokens
        try:
            yield self
        finally:
            self.layer_ids, self.rows, self.paused = (), None, False

    def features(self) -> torch.Tensor:
        """[T, len(layer_ids) * hidden]: the recorded layers concatenated in the spec's order."""
        missing = [i for i in self.layer_ids if i not in self.recorded]
        if missing:
            raise RuntimeError(f"layers {missing} were not recorded in this forward")
        return torch.cat([self.recorded[i] for i in self.layer_ids], dim=-1)
