"""How well the target's intermediate layers tell which drafted tokens its last layer will reject.

    python -m bench.diagnostics.exit_signal [--pair eagle] [--k 4] [--new-tokens 64] [--dtype bfloat16] [--name exit-signal-eagle]

FASER's token-wise early exit (§3 Fig. 5a, §4.2) prunes a drafted token when it
falls outside the top-K of its parent row's *intermediate* logits (final norm +
LM head over the hidden state after layer l, the "logit lens"). The paper finds
this signal up to 95 % accurate at several intermediate layers of 8B-class
models. Whether it holds for a given target is an empirical question, and it
decides whether early exit can prune anything without cutting accepted tokens.

Method: the pair's real engines, in process, serve the engine bench's chat
prompts with greedy chains of ``k`` (plain serial speculative decoding, early
exit off). Forward hooks keep every decoder layer's output during each verify;
for every drafted token that the verify tested, its rank under its parent row's
lens logits at every layer is counted, split by the verify's verdict::

    caught      share of rejected tokens outside the top-K at layer l    (what a prune at l would save)
    false exit  share of accepted tokens outside the top-K at layer l    (what a prune at l would cut)

A usable signal has a high ``caught`` and a ``false exit`` near 0 at a layer
well before the last. Results: bench/results/<name>/ (results.json, README.md).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import typer

from bench.engine_bench import PROMPTS
from bench.harness import machine
from shared.engine.factory import build_feature_draft_engine, build_draft_engine, build_target_engine
from shared.engine import tuned_lens
from shared.engine.eagle.loading import is_eagle_dir
from shared.engine.tuned_lens import TunedLens
from shared.engine.types import PrefillItem, SpecItem, VerifyItem
from shared.models.paths import Paths
from shared.models.registry import get_pair

KS = (1, 10, 100)
app = typer.Typer(add_completion=False)


class LayerTap:
    """Keeps each decoder layer's output hidden states [T, H] of the last forward."""

    def __init__(self, layers) -> None:
        self.out: list[torch.Tensor | None] = [None] * len(layers)
        self.handles = [layer.register_forward_hook(self._hook(i)) for i, layer in enumerate(layers)]

    def _hook(self, i: int):
        def keep(_module, _args, output):
            hidden = output[0] if isinstance(output, tuple) else output
            self.out[i] = hidden.detach()[0]

        return keep

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def tested_ranks(model, tap: LayerTap, tree, status: list[int], lens: TunedLens | None = None) -> list[tuple[int, list[int]]]:
    """(verdict, rank per layer) of every tested node of a chain/tree: rank of its token under its parent's lens.

    ``lens``: a tuned lens translates the layers it was trained for (the others read through the logit lens)."""
    decoder = model.get_decoder()
    num_rows = tap.out[0].shape[0]
    num_fed = num_rows - len(tree.token_ids)  # rows: fed tokens first (the root is the last), then the nodes
    rows = [num_fed - 1 if p < 0 else num_fed + p for p in tree.parent_ids]
    tested = [j for j, s in enumerate(status) if s >= 0]
    if not tested:
        return []
    parent_rows = torch.tensor([rows[j] for j in tested])
    tokens = torch.tensor([tree.token_ids[j] for j in tested])
    ranks = []  # [layers][tested]
    with torch.inference_mode():
        for layer, hidden in enumerate(tap.out):
            h = hidden[parent_rows]  # [tested, hidden]
            if lens is not None:  # the engine's own test: translator, maybe a vocabulary subset
                ranks.append(lens.tokens_above(layer, h, decoder.norm, model.lm_head, torch.arange(len(tested)), tokens).tolist())
                continue
            logits = model.lm_head(decoder.norm(h)).float()  # [tested, vocab]
            own = logits.gather(1, tokens[:, None])
            ranks.append((logits > own).sum(-1).tolist())
    return [(status[j], [ranks[layer][i] for layer in range(len(ranks))]) for i, j in enumerate(tested)]


def summarise(samples: list[tuple[int, list[int]]], num_layers: int) -> list[dict]:
    accepted = [r for s, r in samples if s == 1]
    rejected = [r for s, r in samples if s == 0]
    table = []
    for layer in range(num_layers):
        row = {"layer": layer}
        for k in KS:
            row[f"caught_k{k}"] = sum(r[layer] >= k for r in rejected) / max(1, len(rejected))
            row[f"false_exit_k{k}"] = sum(r[layer] >= k for r in accepted) / max(1, len(accepted))
        table.append(row)
    return table


def _lens_words(results: dict) -> str:
    layers = results.get("lens_layers") or []
    if not layers:
        return "the logit lens (final norm + LM head on the layer's output)"
    vocab = results.get("lens_vocab")
    within = f", ranks within its {vocab} most frequent target tokens (a token outside them ranks 0)" if vocab else ""
    return f"a tuned lens ({results['lens']}) at layers {', '.join(map(str, layers))}; the logit lens elsewhere{within}"


def render(results: dict) -> str:
    m = results["machine"]
    lines = [f"# {results['name']}", "", f"Command: `{results['command']}`  ",
             f"Machine: {m['platform']}, {m['cpu_count']} CPUs, torch {m['torch']}  ",
             f"Date: {results['date']}; duration {results['duration_s']:.0f} s  ",
             f"Models: {results['models']['target']} / {results['models']['draft']}  ",
             f"Intermediate logits: {_lens_words(results)}  ",
             f"Drafted tokens tested: {results['num_accepted']} accepted, {results['num_rejected']} rejected "
             f"(k = {results['k']}, {results['num_prompts']} prompts x {results['new_tokens']} tokens)", "",
             "Share of rejected tokens outside the top-K of their parent row's logits after layer l (caught) and of "
             "accepted tokens (false exit): a prune at layer l with that K saves the first and cuts the second.", "",
             "| layer | " + " | ".join(f"caught K={k} | false exit K={k}" for k in KS) + " |",
             "|---|" + "---|---|" * len(KS)]  # fmt: skip
    for row in results["layers"]:
        cells = " | ".join(f"{row[f'caught_k{k}']:.2f} | {row[f'false_exit_k{k}']:.2f}" for k in KS)
        lines.append(f"| {row['layer']} | {cells} |")
    return "\n".join(lines) + "\n"


@app.command()
def main(
    pair: str = typer.Option("eagle", help="Model pair (tandem models list)."),
    k: int = typer.Option(4, help="Chain length drafted per step."),
    new_tokens: int = typer.Option(64, help="Tokens generated per prompt."),
    num_prompts: int = typer.Option(8, help="How many of the engine bench's prompts."),
    dtype: str = typer.Option("bfloat16", help="Weights of both models."),
    threads: int = typer.Option(2, help="torch threads."),
    lens: str = typer.Option("off", help="off: the logit lens; auto: the target's tuned lens; or a directory holding one."),
    name: str = typer.Option("", help="Results folder under bench/results (default exit-signal-<pair>)."),
    home: str = typer.Option(None, help="Tandem home (default ~/.cache/tandem)."),
) -> None:
    torch.set_num_threads(threads)
    started = time.time()
    paths = Paths.resolve(home)
    try:
        spec_pair = get_pair(pair)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--pair") from None
    target_dir, draft_dir = paths.model_dir(spec_pair.target.name), paths.model_dir(spec_pair.draft.name)
    for d in (target_dir, draft_dir):
        if not d.exists():
            raise typer.BadParameter(f"{d} is missing: run `tandem models prepare --pair {pair}` first", param_hint="--pair")
    target, loaded = build_target_engine(target_dir, dtype=dtype)
    if is_eagle_dir(draft_dir):
        draft = build_feature_draft_engine(draft_dir, target_dir=target_dir, dtype=dtype)
        features = draft.spec
    else:
        draft, _ = build_draft_engine(draft_dir, dtype=dtype, with_tokenizer=False)
        features = None
    model = target.runner.model
    exit_lens = None
    if lens != "off":
        exit_lens = tuned_lens.load(target_dir if lens == "auto" else Path(lens), dtype=target.runner.dtype)
        if exit_lens is None:
            raise typer.BadParameter(f"no {tuned_lens.FILE_NAME} for --lens {lens}", param_hint="--lens")
        exit_lens.attach_head(model.lm_head.weight)
    tap = LayerTap(model.get_decoder().layers)
    samples: list[tuple[int, list[int]]] = []
    tok = loaded.tokenizer
    for i, text in enumerate(PROMPTS[:num_prompts]):
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        sid = f"p{i}"
        first = target.prefill([PrefillItem(sid, ids)], features)[0]
        draft.prefill([PrefillItem(sid, ids, features=first.features)])
        new, feats, produced = [first.first_token], None, 1
        while produced < new_tokens:
            tree = draft.speculate([SpecItem(sid, new_tokens=new, chain_len=k, features=feats)])[0]
            result = target.verify([VerifyItem(sid, tree)], features)[0]
            samples += tested_ranks(model, tap, tree, result.node_status, exit_lens)
            new, feats = result.tokens, result.features
            produced += len(new)
        target.release([sid])
        draft.release([sid])
    tap.close()
    results = {
        "name": name or f"exit-signal-{pair}",
        "command": "python -m bench.diagnostics.exit_signal " + " ".join(sys.argv[1:]),
        "machine": machine(threads),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "duration_s": time.time() - started,
        "models": {"target": str(target_dir), "draft": str(draft_dir)},
        "lens": lens, "lens_layers": exit_lens.layers if exit_lens is not None else [],
        "lens_vocab": int(exit_lens.vocab.numel()) if exit_lens is not None and exit_lens.vocab is not None else 0,
        "k": k, "new_tokens": new_tokens, "num_prompts": num_prompts, "dtype": dtype,
        "num_accepted": sum(s == 1 for s, _ in samples), "num_rejected": sum(s == 0 for s, _ in samples),
        "layers": summarise(samples, len(tap.out)),
    }  # fmt: skip
    out = Path("bench/results") / results["name"]
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "README.md").write_text(render(results))
    print(render(results))


if __name__ == "__main__":
    app()
