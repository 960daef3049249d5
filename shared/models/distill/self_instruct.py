"""Free-form user questions written by the target itself (self-instruct), for a draft's training data.

The templated corpus (corpus.py) has 1,778 prompts built from a few dozen sentence patterns; a
draft trained only on answers to them learns those patterns and transfers poorly to questions
people actually type. Here the target is asked, with sampling, to write the kind of question a
user might ask about a subject, in one of several styles (a question, a how-to, a request to
write or compare, advice): free-form wording with the target's own vocabulary.

    (subject, style) pairs, shuffled ──target, sampled──▶ one line each ──clean, dedupe──▶ questions

Deterministic for a seed (torch.manual_seed before each batch) and cached as JSON under the
cache directory, so reruns do not regenerate them.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from pathlib import Path

import torch

SUBJECTS = [
    "cooking pasta", "baking bread", "gardening", "houseplants", "dogs", "cats", "birds", "fishing", "camping",
    "hiking", "cycling", "swimming", "yoga", "running a marathon", "weight training", "nutrition", "vitamins",
    "sleep", "stress", "friendship", "job interviews", "writing a resume", "public speaking", "negotiation",
    "time management", "budgeting", "taxes", "buying a car", "renting an apartment", "moving to a new city",
    "learning to drive", "travel in Japan", "travel in Italy", "packing for a trip", "airports", "trains",
    "the ocean", "deserts", "mountains", "rivers", "weather", "snow", "thunderstorms", "rainbows", "stars",
    "planets", "the moon", "the sun", "telescopes", "rockets", "satellites", "robots", "smartphones", "laptops",
    "batteries", "Wi-Fi", "passwords", "online privacy", "email etiquette", "spreadsheets", "Python", "JavaScript",
    "SQL", "web design", "video games", "chess", "board games", "painting", "photography", "drawing", "poetry",
    "novels", "history books", "mythology", "ancient Greece", "the Middle Ages", "castles", "pirates", "dinosaurs",
    "fossils", "insects", "butterflies", "sharks", "whales", "elephants", "penguins", "forests", "farming",
    "bread and cheese", "chocolate", "tea", "spices", "vegetarian meals", "breakfast ideas", "birthday parties",
    "weddings", "holidays", "gift ideas", "parenting", "teenagers", "grandparents", "school homework", "exams",
    "studying math", "fractions", "algebra", "geometry", "statistics", "probability", "chemistry experiments",
    "magnets", "light and color", "sound", "music instruments", "the piano", "the guitar", "singing", "dancing",
    "movies", "television", "podcasts", "newspapers", "libraries", "museums", "architecture", "bridges",
    "skyscrapers", "cars", "bicycles repair", "plumbing", "painting a room", "cleaning the house", "laundry",
    "saving energy at home", "composting", "pollution", "oceans and plastic", "wind power", "electric bikes",
    "first aid", "colds and flu", "headaches", "healthy teeth", "eyesight", "running shoes", "fashion",
    "languages", "grammar", "spelling", "idioms", "Shakespeare", "philosophy", "ethics", "happiness", "motivation",
    "habits", "meditation apps", "volunteering", "small businesses", "marketing", "customer service", "startups",
    "investing", "retirement", "insurance", "banks", "credit cards", "shopping online", "recipes with eggs",
    "soup", "salads", "desserts", "coffee brewing", "wine regions", "festivals", "sports rules", "football",
    "basketball", "tennis", "the Olympics", "climbing", "sailing", "maps", "countries of Africa", "South America",
]

STYLES = [
    "Write one question that a curious person might ask an AI assistant about {s}.",
    "Write one short request for advice that someone might send to an assistant about {s}.",
    "Write one 'how do I' question about {s} that a beginner might ask.",
    "Write one request asking an assistant to write something (a poem, a list, a story or a note) about {s}.",
    "Write one question comparing two things related to {s}.",
    "Write one question a student might ask about {s}.",
    "Write one practical question about {s} that someone might ask at home.",
    "Write one question asking for an explanation of something about {s}.",
]

INSTRUCTION = " Reply with the question or request only, in one sentence."


_OPENERS = {
    "what", "how", "why", "which", "where", "when", "who", "can", "could", "should", "is", "are", "do", "does",
    "write", "give", "explain", "tell", "suggest", "describe", "list", "compare", "help", "i", "i'm", "my", "please",
}


def _clean(text: str) -> str | None:
    """The question itself: after a preamble's opening quote if there is one; None unless it reads like one."""
    line = text.strip().splitlines()[0].strip() if text.strip() else ""
    quote = re.search(r'["\u201c]([^"\u201d]{12,})', line)
    if quote:
        line = quote.group(1)
    line = re.sub(r"^(question|request)\s*:\s*", "", line, flags=re.I).strip().strip("'\" ")
    words = line.split()
    if not 4 <= len(words) <= 40 or words[0].lower().strip(",") not in _OPENERS:
        return None
    if "question" in line.lower() or "assistant" in line.lower():  # talk about the task, not a task
        return None
    return line


@torch.inference_mode()
def questions(model, tokenizer, n: int, cache_dir: Path, *, seed: int = 0, batch_size: int = 32,
              progress=print) -> list[str]:
    """Up to ``n`` distinct questions (fewer if the rounds run out), cached by (n, seed, model)."""
    key = hashlib.sha1(json.dumps([n, seed, model.config.name_or_path, STYLES, SUBJECTS]).encode()).hexdigest()[:16]
    path = cache_dir / f"self-instruct-{key}.json"
    if path.is_file():
        return json.loads(path.read_text())
    # Round r samples every (subject, style) pair again in another order and with other draws, so
    # n may exceed the number of pairs; a question seen before (any round) is dropped.
    rounds = max(1, -(-n // len(SUBJECTS) // len(STYLES)) * 2)
    pairs = []
    for r in range(rounds):
        chunk = [(s, t) for s in SUBJECTS for t in STYLES]
        random.Random(seed + 7919 * r).shuffle(chunk)
        pairs += chunk
    seen: set[str] = set()
    out: list[str] = []
    pad = tokenizer.pad_token_id
    for b in range(0, len(pairs), batch_size):
        if len(out) >= n:
            break
        chunk = pairs[b : b + batch_size]
        encoded = [
            tokenizer.apply_chat_template([{"role": "user", "content": t.format(s=s) + INSTRUCTION}],
                                          add_generation_prompt=True, tokenize=True)["input_ids"]
            for s, t in chunk
        ]
        width = max(map(len, encoded))
        ids = torch.tensor([[pad] * (width - len(e)) + e for e in encoded])
        mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encoded])
        torch.manual_seed(seed * 1_000_003 + b)
        gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=48, do_sample=True,
                             temperature=0.9, top_p=0.95, pad_token_id=pad)
        for row in gen[:, width:]:
            q = _clean(tokenizer.decode(row, skip_special_tokens=True))
            if q is not None and q.lower() not in seen:
                seen.add(q.lower())
                out.append(q)
        progress(f"self-instruct: {len(out)} questions after {b + len(chunk)} pairs")
    out = out[:n]
    cache_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=0))
    return out
