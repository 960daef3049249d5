"""The tiny trained pair's corpus and tokenizer: the local CPython standard library, nothing downloaded.

    <stdlib>/**/*.py  (no test suites, no generated data modules; sorted by relative path)
        ├── held out: files whose sha1(relative path) falls in the last HELDOUT_PERCENT %
        └── held in:  tokenizer training, target training, draft prompts

The split is by a hash of each file's path, so a file is held out or not whatever
else the local stdlib holds; the corpus differs across Python versions, which is
why the report records the version and a digest of the file list.
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

HELDOUT_PERCENT = 8
# encodings/: mostly charmap tables; pydoc_data: prose; the test suites: a third of the stdlib, unlike library code.
EXCLUDED_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "pydoc_data", "encodings", "__pycache__"}
MAX_FILE_BYTES = 200_000  # a handful of huge generated tables (unicode data, ...) would dominate the corpus
EOS = "<|endoftext|>"
PAD = "<|pad|>"
SPECIAL_TOKENS = [EOS, PAD]


@dataclass(frozen=True)
class SourceFile:
    path: str  # relative to the stdlib root, '/'-separated
    text: str
    heldout: bool


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_heldout(rel_path: str) -> bool:
    return int(hashlib.sha1(rel_path.encode()).hexdigest(), 16) % 100 >= 100 - HELDOUT_PERCENT


def load(root: Path | None = None) -> list[SourceFile]:
    """Every eligible ``*.py`` file under the stdlib, in sorted order of its relative path."""
    root = root or stdlib_root()
    files = []
    for path in sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix()):
        rel = path.relative_to(root)
        if EXCLUDED_DIRS & set(rel.parts[:-1]) or path.stat().st_size > MAX_FILE_BYTES:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        if text.strip():
            files.append(SourceFile(rel.as_posix(), text, is_heldout(rel.as_posix())))
    return files


def digest(files: list[SourceFile]) -> str:
    """A short fingerprint of the corpus (paths and contents) for the report."""
    h = hashlib.sha1()
    for f in files:
        h.update(f.path.encode() + b"\0" + f.text.encode() + b"\0")
    return h.hexdigest()[:16]


def train_tokenizer(texts: list[str], vocab_size: int):
    """A byte-level BPE (GPT-2 style: every byte string round-trips) as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, pad_token=PAD, bos_token=EOS, model_max_length=512
    )
