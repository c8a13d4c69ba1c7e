"""Problems with verifiable answers, and their chat prompts (the prompts x ~ ρ_X).

Every source becomes a list of :class:`Problem` through one entry point,
:func:`load_problems`:

================ ================================================== =============
name             source                                             answer format
================ ================================================== =============
``add1``         reasoning-gym ``basic_arithmetic``, a + b with     ``number``
                 "one-digit" a, b (reasoning-gym draws 0…10): the
                 CPU default (the task scan in docs/benchmarks.md
                 says why); 121 questions in all
``addmul1``      a + b or a * b ("Calculate 3 * 4."), one-digit a,  ``number``
                 b (0…10): 242 questions in all (the frontier
                 pilot's first task: it saturates)
``addsubmul1``   a + b, a - b or a * b, one-digit a, b (0…10): 363  ``number``
                 questions, negative differences included (the lag
                 frontier's task; its pilot says why)
``add12``        the same with 1–2-digit a, b (0…99)                ``number``
``sum3``         a + b + c, one-digit terms (0…10): 1331 questions, ``number``
                 room for held-out ones (the CPU study's task)
``chain_sum``    reasoning-gym's ``chain_sum``, and                 ``number``
                 ``basic_arithmetic``, at their default settings
                 (overridable)
``gsm_symbolic`` reasoning-gym GSM-style word problems              ``boxed``
``gsm8k``        ``openai/gsm8k`` (config ``main``)                 ``boxed``
``math500``      ``HuggingFaceH4/MATH-500``                         ``boxed``
``aime24``       ``HuggingFaceH4/aime_2024``                        ``boxed``
``deepscaler``   ``agentica-org/DeepScaleR-Preview-Dataset``        ``boxed``
orz-math-57k     Open-Reasoner-Zero's JSON (:func:`load_orz`, for   ``boxed``
                 the 7B throughput recipes)
================ ================================================== =============

The reasoning-gym tasks are generated offline from a seed (same seed, same
problems). The hub datasets load through ``datasets``: from the Hugging Face
cache or the hub, or from local files with ``data_files=`` (jsonl/json/parquet/
csv with the same columns). The answer format says what the prompt asks for
(:data:`ANSWER_INSTRUCTIONS`, after the format's worked example in
:data:`ANSWER_EXAMPLES`) and what :func:`grpo_lab.lm.rewards.strict_answer` takes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..checks import require_int_at_least

ANSWER_INSTRUCTIONS = {
    "number": "Answer with just the number.",
    "boxed": "Think step by step, then put the final answer in \\boxed{}.",
}
ANSWER_EXAMPLES = {
    "number": ("Calculate 20 + 30.", "50"),
}
"""A worked exchange (question, answer) shown before the question, per answer format: a one-shot prompt.
The untrained SmolLM2-135M ignores "just the number" in words (it writes "6 + 2 = 8", which strict
scoring rejects) but copies the form of an example (docs/benchmarks.md, the task scan). Its answer, 50,
lies outside one-digit sums' answers, so copying it earns add1 nothing."""


@dataclass(frozen=True)
class Problem:
    """One prompt with a verifiable answer.

    ================= =========================================================
    field             meaning
    ================= =========================================================
    ``question``      the problem text, without the answer-format instruction
    ``answer``        the gold answer as a string (``"72"``, ``"\\frac{1}{2}"``)
    ``source``        where it came from, e.g. ``"gsm8k:test:17"``
    ``answer_format`` ``"number"`` or ``"boxed"`` (a key of ANSWER_INSTRUCTIONS)
    ``meta``          source-specific extras (level, subject, solution, …)
    ================= =========================================================
    """

    question: str
    answer: str
    source: str
    answer_format: str = "boxed"
    meta: dict[str, Any] = field(default_factory=dict, compare=False)


# ----------------------------------------------------------------------------- reasoning-gym (offline)

@dataclass(frozen=True)
class GymTask:
    dataset: str
    config: dict[str, Any]
    answer_format: str


GYM_TASKS = {
    "add1": GymTask("basic_arithmetic", dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1,
                                             operators=("+",), allow_parentheses=False, allow_negation=False),
                    "number"),
    "addmul1": GymTask("basic_arithmetic", dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1,
                                                operators=("+", "*"), allow_parentheses=False,
                                                allow_negation=False),
                       "number"),
    "addsubmul1": GymTask("basic_arithmetic", dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1,
                                                   operators=("+", "-", "*"), allow_parentheses=False,
                                                   allow_negation=False),
                          "number"),
    "add12": GymTask("basic_arithmetic", dict(min_terms=2, max_terms=2, min_digits=1, max_digits=2,
                                              operators=("+",), allow_parentheses=False, allow_negation=False),
                     "number"),
    "sum3": GymTask("basic_arithmetic", dict(min_terms=3, max_terms=3, min_digits=1, max_digits=1,
                                             operators=("+",), allow_parentheses=False, allow_negation=False),
                    "number"),
    "basic_arithmetic": GymTask("basic_arithmetic", {}, "number"),
    "chain_sum": GymTask("chain_sum", {}, "number"),
    "gsm_symbolic": GymTask("gsm_symbolic", {}, "boxed"),
}


def generate_problems(name: str, n: int, seed: int = 0, **overrides: Any) -> list[Problem]:
    """``n`` problems of the reasoning-gym task ``name`` (a key of GYM_TASKS), from ``seed``.

    ``overrides`` replace fields of the task's reasoning-gym config (e.g.
    ``max_digits=2``). Same (name, n, seed, overrides), same problems.
    """
    import reasoning_gym

    task = GYM_TASKS[_require_name(name, GYM_TASKS)]
    require_int_at_least("n", n, 1)
    require_int_at_least("seed", seed, 0)
    config = {**task.config, **overrides}
    try:
        dataset = reasoning_gym.create_dataset(task.dataset, size=n, seed=seed, **config)
    except (AssertionError, TypeError) as exc:  # reasoning-gym validates with assert
        raise ValueError(f"bad reasoning-gym config for task {name!r}: {config}: {exc}") from exc
    return [Problem(question=entry["question"], answer=str(entry["answer"]), source=f"{name}:seed={seed}:{i}",
                    answer_format=task.answer_format, meta=dict(entry["metadata"]))
            for i, entry in enumerate(dataset)]


# ----------------------------------------------------------------------------- hub datasets

def gsm8k_gold(answer: str) -> str:
    """GSM8K's gold answer: the text after ``####``, thousands commas removed."""
    if "####" not in answer:
        raise ValueError(f"GSM8K answer has no '####' line: {answer[-80:]!r}")
    return answer.split("####")[-1].strip().replace(",", "")


@dataclass(frozen=True)
class HubDataset:
    path: str
    config: str | None
    split: str
    question: tuple[str, ...]  # accepted column names, first present wins
    answer: tuple[str, ...]
    gold: Callable[[str], str] = str.strip
    meta: tuple[str, ...] = ()


HUB_DATASETS = {
    "gsm8k": HubDataset("openai/gsm8k", "main", "test", ("question",), ("answer",), gsm8k_gold),
    "math500": HubDataset("HuggingFaceH4/MATH-500", None, "test", ("problem",), ("answer",),
                          meta=("subject", "level", "unique_id", "solution")),
    "aime24": HubDataset("HuggingFaceH4/aime_2024", None, "train", ("problem", "Problem"), ("answer", "Answer"),
                         meta=("id", "ID", "year", "url")),
    "deepscaler": HubDataset("agentica-org/DeepScaleR-Preview-Dataset", None, "train", ("problem",), ("answer",),
                             meta=("solution",)),
}

ORZ_SOURCE = "orz_math_57k"
"""Source tag of orz-math-57k rows (Open-Reasoner-Zero's training set, the paper's 7B runs)."""
DATA_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def load_hub_problems(name: str, split: str | None = None, data_files: str | Path | Sequence[str | Path] | None = None,
                      limit: int | None = None) -> list[Problem]:
    """Problems of the dataset ``name`` (a key of HUB_DATASETS), through ``datasets``.

    Without ``data_files``: the hub dataset's ``split`` (default: its usual
    evaluation or training split), from the cache or the hub; an offline miss
    raises FileNotFoundError saying to pass ``data_files``. With
    ``data_files`` (a path or list of paths, all of one type): those files.
    ``limit`` keeps the first ``limit`` rows.
    """
    import datasets

    spec = HUB_DATASETS[_require_name(name, HUB_DATASETS)]
    if limit is not None:
        require_int_at_least("limit", limit, 1)
    if data_files is not None:
        files = [str(data_files)] if isinstance(data_files, (str, Path)) else [str(f) for f in data_files]
        suffixes = {Path(f).suffix for f in files}
        if len(suffixes) != 1 or next(iter(suffixes)) not in DATA_BUILDERS:
            raise ValueError(f"data_files must be files of one type among {tuple(DATA_BUILDERS)}, got {files}")
        missing = [f for f in files if not Path(f).is_file()]
        if missing:
            raise FileNotFoundError(f"data_files not found: {missing}")
        origin, split = ",".join(files), "train"  # datasets names the split of plain files "train"
        try:
            rows = datasets.load_dataset(DATA_BUILDERS[suffixes.pop()], data_files=files, split=split)
        except Exception as exc:  # an empty file surfaces as StopIteration or "corresponds to no data"
            raise ValueError(f"dataset {name!r} from {origin} could not be read or has no rows: "
                             f"{type(exc).__name__}: {exc}") from exc
    else:
        origin, split = spec.path, split or spec.split
        try:
            rows = datasets.load_dataset(spec.path, spec.config, split=split)
        except (ConnectionError, FileNotFoundError) as exc:
            raise FileNotFoundError(
                f"dataset {spec.path!r} (split {split!r}) is not in the Hugging Face cache and the hub cannot be "
                f"reached; download it where there is internet, or pass data_files= with local "
                f"jsonl/parquet files having the columns {spec.question[0]!r} and {spec.answer[0]!r}") from exc
    if limit is not None:
        rows = rows.select(range(min(limit, len(rows))))
    if len(rows) == 0:
        raise ValueError(f"dataset {name!r} from {origin} (split {split!r}) has no rows")
    question, answer = _column(rows, spec.question, name), _column(rows, spec.answer, name)
    meta = [c for c in spec.meta if c in rows.column_names]
    return [Problem(question=row[question], answer=spec.gold(str(row[answer])), source=f"{name}:{split}:{i}",
                    answer_format="boxed", meta={c: row[c] for c in meta})
            for i, row in enumerate(rows)]


def _column(rows: Any, accepted: tuple[str, ...], name: str) -> str:
    for column in accepted:
        if column in rows.column_names:
            return column
    raise ValueError(f"dataset {name!r} needs one of the columns {accepted}, has {rows.column_names}")


# ----------------------------------------------------------------------------- one entry point, sampling, prompts

TASK_NAMES = (*GYM_TASKS, *HUB_DATASETS)


def load_problems(name: str, n: int | None = None, *, seed: int = 0, split: str | None = None,
                  data_files: str | Path | Sequence[str | Path] | None = None, **overrides: Any) -> list[Problem]:
    """Problems of any task in TASK_NAMES.

    Generated tasks need ``n`` (and take ``seed`` and config ``overrides``);
    hub datasets take ``split``, ``data_files`` and ``n`` as a row limit.
    """
    name = _require_name(name, TASK_NAMES)
    if name in GYM_TASKS:
        if n is None:
            raise ValueError(f"n (number of problems to generate) is required for task {name!r}")
        if split is not None or data_files is not None:
            raise ValueError(f"task {name!r} is generated: it takes no split or data_files, "
                             f"got split={split!r}, data_files={data_files!r}")
        return generate_problems(name, n, seed, **overrides)
    if n is not None:
        require_int_at_least("n", n, 1)
    if overrides:
        raise ValueError(f"task {name!r} is a dataset and takes no config overrides, got {sorted(overrides)}")
    return load_hub_problems(name, split=split, data_files=data_files, limit=n)


def load_orz(path: str | Path, limit: int | None = None) -> list[Problem]:
    """orz-math-57k (Open-Reasoner-Zero's ``data/orz_math_57k_collected.json``): a JSON list of
    ``[{"from": "human", "value": question}, {"from": "assistant", "ground_truth": {"value": answer}}]``;
    ``limit`` keeps the first rows."""
    rows = json.loads(Path(path).read_text())
    problems = [Problem(question=q["value"], answer=str(a["ground_truth"]["value"]).strip(),
                        source=f"{ORZ_SOURCE}:{i}") for i, (q, a) in enumerate(rows[:limit])]
    if not problems:
        raise ValueError(f"{str(path)!r} holds no problems")
    return problems


def sample_problems(problems: Sequence[Problem], n: int, generator: torch.Generator) -> list[Problem]:
    """``n`` distinct problems drawn uniformly (without replacement) with ``generator``."""
    require_int_at_least("n", n, 1)
    if n > len(problems):
        raise ValueError(f"n must be <= the number of problems ({len(problems)}), got {n}")
    return [problems[i] for i in torch.randperm(len(problems), generator=generator)[:n].tolist()]


def build_prompt(problem: Problem, tokenizer: Any, system_prompt: str | None = None) -> str:
    """The prompt text for ``problem``: the chat of :func:`chat_messages`.

    With a chat template: ``apply_chat_template`` ending with the assistant's
    generation prompt; ``system_prompt=None`` keeps the template's own default
    (SmolLM2-135M answers add1 more often with it than with a custom maths
    system prompt). Without a chat template: plain text, ``system\\n\\n``, then
    ``question\\ninstruction\\nAnswer: answer\\n\\n`` per example, then
    ``question\\ninstruction\\nAnswer:``.
    """
    messages = chat_messages(problem, system_prompt)
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    turns = [m for m in messages if m["role"] != "system"]
    shots = "".join(f"{q['content']}\nAnswer: {a['content']}\n\n" for q, a in zip(turns[:-1:2], turns[1::2],
                                                                                 strict=True))
    return (f"{system_prompt}\n\n" if system_prompt else "") + f"{shots}{turns[-1]['content']}\nAnswer:"


def chat_messages(problem: Problem, system_prompt: str | None = None) -> list[dict[str, str]]:
    """The chat of ``problem``: an optional system message, the format's example exchange if it has one
    (:data:`ANSWER_EXAMPLES`), then the user message (question, then the answer-format instruction).
    :func:`build_prompt` renders it; TRL datasets take it as is."""
    if problem.answer_format not in ANSWER_INSTRUCTIONS:
        raise ValueError(f"answer_format must be one of {tuple(ANSWER_INSTRUCTIONS)}, got {problem.answer_format!r}")
    instruction = ANSWER_INSTRUCTIONS[problem.answer_format]
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    example = ANSWER_EXAMPLES.get(problem.answer_format)
    shot = [] if example is None else [{"role": "user", "content": f"{example[0]}\n{instruction}"},
                                       {"role": "assistant", "content": example[1]}]
    return [*system, *shot, {"role": "user", "content": f"{problem.question}\n{instruction}"}]


def _require_name(name: Any, names: Any) -> str:
    if name not in tuple(names):
        raise ValueError(f"task name must be one of {tuple(names)}, got {name!r}")
    return name


def all_questions(name: str, limit: int = 2000) -> list[Problem]:
    """Every distinct question of a small generated task (sorted by question): the set exact J averages over.

    Exact J is an expectation over the task's question distribution; reasoning-gym's one-digit tasks draw
    their questions uniformly (each operator, then each operand), so the mean over distinct questions is that
    expectation. Draws grow until they number ≥ 20× the distinct questions seen, so a question is missed with
    probability below e^-20 each. Raises a ValueError naming the task if it has more than ``limit``.
    """
    n = 1024
    while True:
        distinct = {p.question: p for p in generate_problems(name, n)}
        if len(distinct) > limit:
            raise ValueError(f"task {name!r} has more than {limit} distinct questions; exact J over all of them "
                             "is for small tasks (add1, addmul1, addsubmul1, sum3)")
        if n >= 20 * len(distinct):
            return [distinct[q] for q in sorted(distinct)]
        n *= 2
