"""Offline prompt sets: chat questions, code completion, summarisation, and grounded tasks (copy-heavy).

Nothing is downloaded. Chat questions are written here; code and
summarisation prompts are cut from the Python standard library installed with
the interpreter (function heads to complete, module docstrings to summarise),
so every machine with the same Python builds the same prompts.
"""

from __future__ import annotations

import ast
import random
import sysconfig
from bisect import bisect_right
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from bench import grounded_prompts as grounded

CHAT = [
    "Explain why the sky is blue to a ten-year-old.",
    "Write a short poem about the sea at night.",
    "What are the main differences between Python lists and tuples?",
    "Give me three tips for a good night's sleep.",
    "Summarise the plot of Romeo and Juliet in two sentences.",
    "How does a refrigerator keep food cold?",
    "What is the capital of Australia, and why was it chosen?",
    "Describe the water cycle step by step.",
    "List five fruits that are rich in vitamin C.",
    "Why do cats purr?",
    "Explain recursion with a simple example.",
    "What should I pack for a weekend hiking trip?",
    "How do vaccines train the immune system?",
    "Translate 'good morning, how are you?' into French and Spanish.",
    "What is the difference between weather and climate?",
    "Give me a recipe for a simple tomato soup.",
    "What causes the seasons on Earth?",
    "How do I write a polite email asking for a deadline extension?",
    "Explain what a black hole is in simple terms.",
    "What are the benefits of learning a second language?",
    "Describe how a bill becomes a law.",
    "What is photosynthesis?",
    "Suggest three names for a small bakery.",
    "How can I improve my focus while studying?",
    "What is the Pythagorean theorem and how is it used?",
    "Why is exercise good for mental health?",
    "Explain the difference between a virus and a bacterium.",
    "Write a haiku about autumn leaves.",
    "What are some good habits for saving money?",
    "How does the internet work, briefly?",
    "What is machine learning?",
    "Describe the rules of chess in a few sentences.",
]

KINDS = ("chat", "code", "summarize", "rewrite", "qa", "agent")
GROUNDED = ("summarize", "rewrite", "qa", "agent")  # the answer is largely in the prompt (bench/grounded_prompts.py)


@dataclass(frozen=True)
class Prompt:
    kind: str  # one of KINDS
    text: str  # the (last) user message (chat template applied by the tokenizer side)
    turns: tuple[tuple[str, str], ...] = ()  # earlier (role, content) turns: multi-turn agent transcripts

    def messages(self) -> list[dict[str, str]]:
        return [*({"role": r, "content": c} for r, c in self.turns), {"role": "user", "content": self.text}]


def _stdlib_files(limit: int) -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py") if p.stat().st_size < 200_000)
    return files[:limit]


def _code_prompts(files: list[Path]) -> list[str]:
    out = []
    for path in files:
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        lines = path.read_text(encoding="utf-8").splitlines()
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and ast.get_docstring(node) and node.end_lineno - node.lineno >= 4:
                body_start = node.body[1].lineno if len(node.body) > 1 else node.end_lineno
                head = "\n".join(lines[node.lineno - 1 : body_start - 1])
                if 40 <= len(head) <= 600:
                    out.append(f"Complete this Python function:\n\n```python\n{head}\n```")
    return out


def _summary_prompts(files: list[Path]) -> list[str]:
    out = []
    for path in files:
        try:
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        except (SyntaxError, UnicodeDecodeError):
            continue
        if doc and 300 <= len(doc) <= 2000:
            out.append(f"Summarise the following text, reusing its own wording where you can:\n\n{doc}")
    return out


def load(kind: str, n: int, seed: int = 0) -> list[Prompt]:
    """``n`` prompts of one kind, sampled (with repetition only if the pool is smaller) by seed."""
    if kind not in KINDS:
        raise ValueError(f"unknown prompt kind {kind!r}; choose from {KINDS}")
    pool = _pool(kind)
    if not pool:
        raise RuntimeError(f"no {kind} prompts could be built from the standard library")
    rng = random.Random(seed)
    picks = rng.sample(pool, n) if n <= len(pool) else [rng.choice(pool) for _ in range(n)]
    return picks


@lru_cache(maxsize=None)
def _pool(kind: str) -> tuple[Prompt, ...]:
    """Every prompt of ``kind``, built once per process (a grounded kind parses 200 stdlib files: 1.5 s)."""
    if kind == "chat":
        return tuple(Prompt(kind, t) for t in CHAT)
    files = _stdlib_files(400)
    if kind == "agent":
        return tuple(Prompt(kind, text, turns) for text, turns in grounded.agent_prompts(files))
    build = {"code": _code_prompts, "summarize": _summary_prompts, "rewrite": grounded.rewrite_prompts,
             "qa": grounded.qa_prompts}[kind]
    return tuple(Prompt(kind, t) for t in build(files))


def all_bench_texts() -> list[str]:
    """Every message any benchmark may send (all kinds, every turn): what training corpora must not contain."""
    return [m["content"] for kind in KINDS for p in _pool(kind) for m in p.messages()]


class BenchTexts:
    """Every benchmark message (``all_bench_texts``), to ask whether a text overlaps one: equals it, is
    contained in it or contains it, case and surrounding space aside (what a training corpus must not hold)."""

    def __init__(self, texts: list[str] | None = None) -> None:
        self.texts = [t.strip().lower() for t in (all_bench_texts() if texts is None else texts)]
        self._joined = "\x00".join(self.texts)  # one search finds a text inside any of them
        self._needles = sorted(set(self.texts), key=len)
        self._lengths = [len(t) for t in self._needles]

    def overlaps(self, text: str) -> bool:
        t = text.strip().lower()
        if not self.texts:
            return False
        if "\x00" in t:
            return any(t in b or b in t for b in self.texts)
        if t in self._joined:  # inside (or equal to) a bench text: with no NUL in t, no match spans two
            return True
        return any(b in t for b in self._needles[: bisect_right(self._lengths, len(t))])  # only shorter ones fit


def mixed(n: int, mix: dict[str, float], seed: int = 0) -> list[Prompt]:
    """``n`` prompts whose kinds follow ``mix`` (weights by kind), shuffled deterministically."""
    rng = random.Random(seed)
    kinds = rng.choices(list(mix), weights=list(mix.values()), k=n)
    pools = {k: iter(load(k, kinds.count(k), seed)) for k in set(kinds)}
    return [next(pools[k]) for k in kinds]
