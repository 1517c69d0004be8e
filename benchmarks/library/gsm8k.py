"""GSM8K: few-shot prompts from train, exact-match scoring of the final number."""

from __future__ import annotations

import json
import re
from pathlib import Path

import attrs

SHOTS = 4
STOP = ["\n\nQuestion:", "\nQuestion:"]
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


@attrs.frozen
class Problem:
    id: str
    question: str
    solution: str   # worked solution ending "The answer is N."
    answer: str     # N, normalised


def _number(text: str) -> str:
    return text.replace(",", "").rstrip(".")


def _solution(raw: str) -> tuple[str, str]:
    """GSM8K's answer field -> (solution in our format, final number)."""
    work, final = raw.split("####")
    work = re.sub(r"<<[^>]*>>", "", work).strip()   # calculator annotations
    answer = _number(final.strip())
    return f"{work}\nThe answer is {answer}.", answer


def load(source: str, limit: int | None = None, offset: int = 0) -> list[Problem]:
    """Problems from a JSONL path, or a Hugging Face dataset name (needs a network)."""
    path = Path(source)
    if path.is_file():
        rows = [json.loads(line) for line in path.open()]
        name = path.stem
    else:
        try:
            from datasets import load_dataset
        except ImportError:
            raise SystemExit(f"{source} is not a file, and reading a Hugging Face dataset "
                             f"needs the `datasets` package") from None
        rows = list(load_dataset(source, "main", split="test"))
        name = source.replace("/", "_")
    rows = rows[offset:] if limit is None else rows[offset:offset + limit]
    problems = []
    for i, row in enumerate(rows):
        solution, answer = _solution(row["answer"])
        problems.append(Problem(f"{name}-{offset + i}", row["question"], solution, answer))
    return problems


def prompt(problem: Problem, shots: list[Problem]) -> str:
    examples = "".join(f"Question: {s.question}\nAnswer: {s.solution}\n\n" for s in shots)
    return f"{examples}Question: {problem.question}\nAnswer:"


def extract(text: str) -> str | None:
    """The final answer of a completion: the first number after the last "answer is", else
    the last number."""
    if "answer is" in text:
        found = _NUMBER.findall(text.rsplit("answer is", 1)[1])
        if found:
            return _number(found[0])
    numbers = _NUMBER.findall(text)
    return _number(numbers[-1]) if numbers else None


def correct(text: str, problem: Problem) -> bool:
    got = extract(text)
    if got is None:
        return False
    try:
        return float(got) == float(problem.answer)
    except ValueError:
        return got == problem.answer
