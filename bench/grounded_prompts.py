"""Grounded prompts: the answer is largely in the prompt (edit, answer over context, agent loops).

Built offline and deterministically from the Python standard library installed with the
interpreter, like the code and summarise sets (bench/prompts.py):

    rewrite  edit a given piece: rename a parameter in a function and return it whole, or turn a
             module's documentation into a bulleted list keeping its wording
    qa       a module's documentation as context, a question answered from it in its own words
    agent    a multi-turn agent transcript: the task, a read_file call, the file's text as tool
             output, a show_lines call, the function's source as tool output, then the request to
             write the function out with comments (tool output repeated, as agent loops do)

These are where model-free drafting (n-gram prompt lookup, suffix trees) shines: the output
copies long spans of the input. None of this text is in any training corpus (the EAGLE
head's corpus is templated questions plus the target's own questions; see
tests/bench/test_bench_prompts_disjoint.py).
"""

from __future__ import annotations

import ast
from pathlib import Path

Turns = tuple[tuple[str, str], ...]


def _functions(path: Path) -> list[tuple[str, str, list[str]]]:
    """(name, source, parameter names) of module-level functions of 5-40 lines with a docstring."""
    try:
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
    except (SyntaxError, UnicodeDecodeError):
        return []
    lines = text.splitlines()
    out = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and ast.get_docstring(node) and 5 <= node.end_lineno - node.lineno <= 40:
            params = [a.arg for a in node.args.args if a.arg not in ("self", "cls") and len(a.arg) > 1]
            out.append((node.name, "\n".join(lines[node.lineno - 1 : node.end_lineno]), params))
    return out


def _doc(path: Path) -> str | None:
    try:
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    except (SyntaxError, UnicodeDecodeError):
        return None
    return doc if doc and 300 <= len(doc) <= 1500 else None


def rewrite_prompts(files: list[Path]) -> list[str]:
    out = []
    for i, path in enumerate(files):
        if i % 2 == 0:
            for name, source, params in _functions(path)[:1]:
                if params:
                    p = params[0]
                    out.append(f"Rename the parameter `{p}` of this function to `{p}_value` everywhere it is used and "
                               f"return the complete updated function:\n\n```python\n{source}\n```")
        elif (doc := _doc(path)) is not None:
            out.append("Rewrite the following text as a bulleted list, one bullet per sentence, keeping the "
                       f"original wording:\n\n{doc}")
    return out


def qa_prompts(files: list[Path]) -> list[str]:
    out = []
    for path in files:
        if (doc := _doc(path)) is not None:
            out.append(f"Read the documentation below and answer the question.\n\n{doc}\n\nQuestion: according to "
                       f"this text, what does the `{path.stem}` module provide, and how is it used? Answer with "
                       "sentences from the text.")
    return out


def agent_prompts(files: list[Path]) -> list[tuple[str, Turns]]:
    """(final user message, earlier turns) per transcript."""
    out = []
    for path in files:
        functions = _functions(path)
        if not functions:
            continue
        name, source, _ = functions[0]
        text = path.read_text(encoding="utf-8").splitlines()
        start = max(0, text.index(source.splitlines()[0]) - 10) if source.splitlines()[0] in text else 0
        excerpt = "\n".join(text[start : start + 60])
        turns: Turns = (
            ("user", f"You are a coding agent in a Python project. Find the function `{name}` in `{path.name}` and "
                     "explain it."),
            ("assistant", f"I will read the file first.\n<tool_call>read_file(\"{path.name}\")</tool_call>"),
            ("user", f"<tool_output>\n{excerpt}\n</tool_output>"),
            ("assistant", f"`{name}` is in this file. Let me show exactly its lines.\n"
                          f"<tool_call>show_function(\"{path.name}\", \"{name}\")</tool_call>"),
        )
        final = (f"<tool_output>\n{source}\n</tool_output>\nNow write the function `{name}` out in full, unchanged, "
                 "with a short comment above each statement.")
        out.append((final, turns))
    return out
