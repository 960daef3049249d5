"""The modules a fused forward runs: the fused decoder and the model's LM head, under one parent.

cpu_linear's ``prepack`` and ``pad_single_rows`` swap the linear layers of the
module they are given; given this one, they swap the fused decoder's and the
LM head's (in this parent, so the transformers model keeps its plain head) and
never spend packed copies on the transformers layers the fused path does not run.
"""

from __future__ import annotations

from torch import nn

from shared.engine.fused.decoder import FusedDecoder


class FusedCausalLM(nn.Module):
    def __init__(self, decoder: FusedDecoder, lm_head: nn.Module):
        super().__init__()
        self.decoder = decoder
        self.lm_head = lm_head  # the model's module (tied to the embedding or not); cpu_linear may swap it here

    def get_decoder(self) -> FusedDecoder:
        return self.decoder

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head
