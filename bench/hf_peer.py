"""HF transformers peers, in the harness process: ``generate`` of the target alone, and assisted generation.

    peer = HFPeer.load(target_dir, draft_dir)
    send = peer.sender(configs.parse("hf-assisted"), eos_token_ids)   # a bench.drivers.Sender, batch 1

Same model directories as the Tandem services, fp32 on CPU, greedy. A
streamer stamps the tokens as ``generate`` produces them: plain decoding puts
one token per forward; assisted generation (``_assisted_decoding``) puts the
accepted candidates plus the target's own token once per verification, so a
step of n tokens accepted n − 1 draft tokens (the last step may be cut by
max_new_tokens). HF does not report how many candidates it proposed, so its
acceptance *rate* stays unknown; accepted length per step is exact.

The assistant's schedule comes from the draft model's ``generation_config``
(transformers copies it per call), so each call sets it: unset fields mean the
library defaults (transformers 5: 20 tokens, "constant", confidence threshold
0.4, adapted per step with scikit-learn's ROC when it is installed).

Generation runs on the event loop's thread and blocks it: fine at batch 1,
which is all these peers are used for (nothing else runs meanwhile).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from bench.configs import Config
from bench.drivers import Job, OnChunk, Outcome, Sender

_SCHEDULE_FIELDS = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")


class _ChunkStreamer:
    """transformers' streamer protocol (put/end): the first put is the prompt, then the new tokens."""

    def __init__(self, on_chunk: OnChunk, assisted: bool) -> None:
        self.on_chunk = on_chunk
        self.assisted = assisted
        self.prompt_seen = False
        self.num_tokens = 0

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        ids = [int(t) for t in value.reshape(-1)]
        # plain decoding: the first token comes from the prefill forward, not from a step
        is_step = self.assisted or self.num_tokens > 0
        self.on_chunk(ids, len(ids) - 1 if self.assisted else 0, is_step)
        self.num_tokens += len(ids)

    def end(self) -> None:
        pass


class HFPeer:
    def __init__(self, target: Any, draft: Any | None, threads: int | None = None) -> None:
        self.target = target
        self.draft = draft
        self.threads = threads

    @classmethod
    def load(cls, target_dir: Path, draft_dir: Path | None, threads: int | None = None) -> HFPeer:
        from shared.engine.loading import load_causal_lm

        def load(path: Path) -> Any:
            return load_causal_lm(path, dtype="float32", device="cpu", with_tokenizer=False).model

        return cls(load(target_dir), load(draft_dir) if draft_dir is not None else None, threads)

    def sender(self, config: Config, eos_token_ids: list[int]) -> Sender:
        assisted = config.speculation == "assisted"
        if assisted and self.draft is None:
            raise ValueError(f"{config.name} needs a draft model")
        schedule = {f: config.hf_options.get(f) for f in _SCHEDULE_FIELDS}

        async def send(job: Job, on_chunk: OnChunk) -> Outcome:
            return self.generate(job, on_chunk, assisted, schedule, eos_token_ids)

        return send

    def generate(
        self, job: Job, on_chunk: OnChunk, assisted: bool, schedule: dict, eos_token_ids: list[int]
    ) -> Outcome:
        if self.threads:
            torch.set_num_threads(self.threads)
        prompt = torch.tensor([list(job.encoded.prompt_ids)])  # [1, prompt_len]
        streamer = _ChunkStreamer(on_chunk, assisted)
        kwargs: dict[str, Any] = {}
        if assisted:
            for name, value in schedule.items():
                setattr(self.draft.generation_config, name, value)
            kwargs["assistant_model"] = self.draft
        eos = eos_token_ids or None
        out = self.target.generate(
            input_ids=prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=job.max_new_tokens,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=eos[0] if eos else 0,
            streamer=streamer,
            **kwargs,
        )
        new = out[0, prompt.shape[1] :].tolist()
        finish = "eos" if eos and new and new[-1] in eos else "length"
        return Outcome(finish_reason=finish)
