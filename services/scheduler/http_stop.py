"""OpenAI's stop strings: the answer's text ends before the first stop string, which it does not contain.

The scheduler stops once the output text contains a stop string and keeps it (the gRPC contract); the HTTP
layer cuts it off, unless the body asks ``include_stop_str_in_output`` (vLLM's option). A stream holds back
the last ``longest - 1`` characters until they cannot begin a stop string, so no chunk ever carries one.
"""

from __future__ import annotations


class StopTrimmer:
    def __init__(self, stops: list[str], keep: bool = False) -> None:
        self.stops = [s for s in stops if s] if not keep else []
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.text = ""
        self.sent = 0
        self.cut: int | None = None  # where the first stop string starts, once seen

    def push(self, delta: str, final: bool = False) -> str:
        """The text that may be sent now, given ``delta`` more of the output (``final``: nothing follows)."""
        if self.cut is not None:
            return ""
        self.text += delta
        hits = [i for i in (self.text.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.cut = min(hits)
            end = self.cut
        else:
            end = len(self.text) if final or not self.hold else max(self.sent, len(self.text) - self.hold)
        out, self.sent = self.text[self.sent : end], max(self.sent, end)
        return out

    def whole(self, text: str) -> str:
        return self.push(text, final=True)
