"""Reliability, measured: bad inputs, hostile answers, faults, determinism and the memory guard.

Runs the checks of the reliability tests on more inputs and on both kinds of run, from the modules
they share (``tests/bad_input_catalogue.py``, ``tests/hostile_answers.py``, ``tests/fault_scenarios.py``,
``tests/reliability_runs.py``), plus the slow ones the test suite leaves out:

* **bad inputs** — ``CONFIG_CASES`` and ``CATALOGUE`` (datasets, prompts,
  model names, checkpoint paths, reward functions, memory): each must raise the named error with a
  message naming the parameter and the value; the time to the error is measured;
* **hostile answers** — ``--examples`` hypothesis completions (unicode, huge numbers, LaTeX nested up
  to ``--depth``, empty and 100k-character strings) plus fixed worst cases, through answer extraction
  and the math-verify reward at ``--timeout``: none may raise; the worst latency is reported with a
  warm worker and including a worker restart;
* **faults** — every scenario of ``SCENARIOS`` on the bandit and on the tiny LM (SIGKILL in the
  middle of a checkpoint write, NaN gradient clipped and unclipped, non-finite loss, a poisoned
  step inside ``train``, KeyboardInterrupt/SIGINT while sampling, training and syncing; a disk too
  full for the checkpoints before the run, a disk that fills in the middle of a checkpoint or of a
  metrics line, a read-only output_dir from the start or mid-run), and a math-verify worker killed
  mid-call: each must stop clearly, resume bit for bit, lose nothing; on the tiny LM also the sync faults of
  ``tests/sync_faults.py`` (a sync that does nothing, skips a norm's weight or a large tensor, swaps two
  layers' ``down_proj``, leaves a tied LM head behind): each must stop with a ``SyncError`` naming the tensor;
* **determinism** (slow) — 2 steps of the real SmolLM2-135M on CPU: same seed twice, then another seed;
* **memory** (slow) — the guard's estimate against the peak RSS of 2 real SmolLM2 steps in a fresh
  process, for two batch shapes. The peak is ``VmHWM``, reset once the model is loaded
  (``/proc/self/clear_refs``); not ``getrusage``'s ``ru_maxrss``, which in a child started by a
  big process begins at the parent's RSS (Linux folds the pre-exec memory into it).

::

    python tests/reliability_report.py           # everything: 133 s measured on 2 quiet CPU cores
    python tests/reliability_report.py --quick   # no SmolLM2, fewer answers
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import bad_input_catalogue as catalogue
import fault_scenarios as scenarios
import hostile_answers as answers
import reliability_runs as runs
import torch
from hypothesis import HealthCheck, given, settings

from grpo_lab import GRPOConfig
from grpo_lab.exact.bandit import single_thread
from grpo_lab.lm import rewards, verifier_pool

REPO = Path(__file__).resolve().parent.parent

POWER_TOWER = "2^{2^{2^{2^{2^{2}}}}}"  # math-verify spends ~5 s on it
WORST_ANSWERS = {
    "power tower": f"\\boxed{{{POWER_TOWER}}}",
    "\\sqrt nested 140 deep": "\\boxed{" + "\\sqrt{" * 140 + "2" + "}" * 140 + "}",
    "\\frac nested 60 deep": "\\boxed{" + "\\frac{" * 60 + "1" + "}{2}" * 60 + "}",
    "braces nested 450 deep": "\\boxed{" + "{" * 450 + "1" + "}" * 450 + "}",
    "100k unclosed \\boxed{": "\\boxed{" * 14_285,
    "100k digits": "9" * 100_000,
    "100k-digit decimal": "0." + "1" * 100_000,
    "100k braces": "{" * 50_000 + "}" * 50_000,
    "lone surrogate": "\ud800 \\boxed{\udfff}",
}


def bad_inputs() -> dict[str, Any]:
    """Every catalogue case: right error type, message matching, and the time to the error."""
    cases = [catalogue.BadInput(f"GRPOConfig({changes})", functools.partial(GRPOConfig, **changes), ValueError,
                                message) for changes, message in catalogue.CONFIG_CASES] + catalogue.CATALOGUE
    unclear, times = [], []
    for case in cases:
        start = time.perf_counter()
        try:
            case.call()
            error: BaseException | None = None
        except BaseException as exc:  # noqa: BLE001 - every outcome is measured
            error = exc
        times.append((time.perf_counter() - start, case.name))
        if not (isinstance(error, case.error) and re.search(case.pattern, str(error))):
            unclear.append(f"{case.name}: {type(error).__name__}: {str(error)[:160]}")
    slowest = sorted(times, reverse=True)[:3]
    print(f"bad inputs: {len(cases)} tried, {len(cases) - len(unclear)} clear errors; slowest to fail: "
          + ", ".join(f"{name} {seconds:.2f} s" for seconds, name in slowest)
          + " (first imports of datasets / reasoning-gym included)")
    for line in unclear:
        print(f"  UNCLEAR {line}")
    return {"tried": len(cases), "clear": len(cases) - len(unclear)}


def hostile_answers(examples: int, depth: int, timeout: float) -> dict[str, Any]:
    """Fuzzed and fixed worst-case completions: exceptions, worst latency (warm / with a restart)."""
    seen: list[tuple[float, bool, str]] = []
    raised: list[str] = []
    too_slow: list[str] = []

    def score(completion: str, gold: str, label: str) -> None:
        try:
            _, seconds, warm = answers.score_answer(completion, gold, timeout)
            seen.append((seconds, warm, label))
        except TimeoutError as exc:  # extraction over answers.PARENT_SLACK_S: it has no timeout of its own
            too_slow.append(f"{label}: {exc}"[:200])
        except Exception as exc:  # noqa: BLE001 - counted, never expected
            raised.append(f"{label}: {type(exc).__name__}: {exc}"[:200])

    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(completion=answers.completions(depth), gold=answers.GOLDS)
    def fuzz(completion: str, gold: str) -> None:
        score(completion, gold, repr(completion[:40]))

    rewards.answers_match("\\frac{1}{2}", "0.5")  # start the worker: its first start is not a reward's cost
    fuzz()
    for label, completion in WORST_ANSWERS.items():
        score(completion, "5", label)
    warm = max((s for s in seen if s[1]), default=(0.0, True, "-"))
    cold = max(seen, default=(0.0, False, "-"))
    stats = verifier_pool.verifier_stats()
    print(f"hostile answers: {len(seen) + len(raised) + len(too_slow)} scored (timeout {timeout} s), "
          f"{len(raised)} raised, {len(too_slow)} with extraction over {answers.PARENT_SLACK_S} s; worst latency "
          f"{warm[0]:.2f} s with a warm worker ({warm[2]}), {cold[0]:.2f} s including a worker restart "
          f"({cold[2]}); math-verify: {stats}")
    for line in raised:
        print(f"  RAISED {line}")
    for line in too_slow:
        print(f"  TOO SLOW {line}")
    worst_extraction = extraction_scaling()
    return {"scored": len(seen) + len(raised) + len(too_slow), "raised": len(raised), "too_slow": len(too_slow),
            "warm_s": warm[0], "cold_s": cold[0], "extraction_s": worst_extraction}


def extraction_scaling() -> float:
    """Worst seconds to extract an answer (and check its format) from the 100k-character pieces of
    the fuzzer, measured directly (capped at 60 s): extraction runs in the trainer, with no timeout."""
    worst = 0.0
    for piece in answers.LONG_PIECES:
        text = piece * (100_000 // len(piece))
        start = time.perf_counter()
        try:
            with answers.within(60.0, "extraction"):
                rewards.extract_answer(text)
                rewards.format_reward(text, "boxed")
        except TimeoutError:
            pass
        worst = max(worst, time.perf_counter() - start)
    print(f"  answer extraction on 100k characters: worst {worst * 1e3:.0f} ms over {len(answers.LONG_PIECES)} pieces")
    return worst


def kill_the_verifier() -> scenarios.Outcome:
    """SIGKILL the math-verify worker in the middle of a call: that answer scores 0, the next is right."""
    outcome = scenarios.Outcome("math-verify worker killed mid-call")
    rewards.answers_match("\\frac{1}{2}", "0.5")
    worker, crashes = verifier_pool._VERIFIER.worker.proc, verifier_pool.verifier_stats()["crashes"]
    threading.Timer(0.3, worker.kill).start()
    outcome.checks["the killed call scores 0"] = rewards.answers_match(POWER_TOWER, "5", timeout=10.0) is False
    outcome.checks["counted as a crash"] = verifier_pool.verifier_stats()["crashes"] == crashes + 1
    outcome.checks["the next call is right"] = rewards.answers_match("\\frac{2}{4}", "0.5")
    return outcome


def faults(kinds: tuple[str, ...]) -> dict[str, Any]:
    """Every scenario on every kind of run, plus the verifier kill."""
    outcomes = []
    for kind in kinds:
        sync_faults = scenarios.SYNC_SCENARIOS if kind == "lm" else {}
        for name, scenario in {**scenarios.SCENARIOS, **sync_faults}.items():
            with tempfile.TemporaryDirectory() as tmp:
                start = time.perf_counter()
                try:
                    outcome = scenario(Path(tmp), kind)
                except Exception as exc:  # noqa: BLE001 - a scenario that crashes is a failed recovery
                    outcome = scenarios.Outcome(f"{name} ({kind})", {"ran": False}, note=repr(exc)[:300])
                outcomes.append(outcome)
                print(f"  {'ok  ' if outcome.ok else 'FAIL'} {outcome.fault} [{time.perf_counter() - start:.1f} s]"
                      + ("" if outcome.ok else f": {outcome.failed()} {outcome.note}")
                      + (f" ({outcome.note})" if outcome.ok and outcome.note else ""))
    outcomes.append(kill_the_verifier())
    print(f"  {'ok  ' if outcomes[-1].ok else 'FAIL'} {outcomes[-1].fault}")
    resumed = [o for o in outcomes if o.resumed]
    identical = [o for o in resumed if all(v for k, v in o.checks.items() if k.startswith("resumed run"))]
    return {"injected": len(outcomes), "recovered": sum(o.ok for o in outcomes), "resumed": len(resumed),
            "identical": len(identical), "lost": sum(o.lost for o in outcomes)}


def smollm2_determinism() -> dict[str, Any]:
    """2 steps of the real SmolLM2 on CPU, seed 0 twice and seed 1: records, completions, weights."""
    from grpo_lab.lm.build import build_loop
    from grpo_lab.lm.models import load_policy
    from grpo_lab.lm.tasks import load_problems
    from grpo_lab.lm.train_config import TrainConfig

    def two_steps(seed: int) -> tuple[list[dict[str, Any]], list[torch.Tensor], dict[str, torch.Tensor]]:
        model, tokenizer = load_policy("smollm2-135m")
        config = TrainConfig(G=4, prompts_per_step=2, max_completion_length=8, temperature=0.7, lr=1e-5,
                             steps=2, seed=seed)
        loop = build_loop(config, model, tokenizer, load_problems("add1", 50, seed=0))
        seen, real = [], loop.sampler.sample
        loop.sampler.sample = lambda *args: seen.append(real(*args)) or seen[-1]
        list(loop.run())
        return runs.rows_of(loop.history), [r.completions for r in seen], {
            k: v.clone() for k, v in loop.policy.state_dict().items()}

    start = time.perf_counter()
    first, again, other = two_steps(0), two_steps(0), two_steps(1)
    same = (first[0] == again[0] and all(map(torch.equal, first[1], again[1]))
            and runs.same_tensors(first[2], again[2]))
    differs = not torch.equal(first[1][0], other[1][0])
    print(f"determinism, SmolLM2-135M 2 steps on CPU: same seed identical = {same} (records, completions, "
          f"weights); another seed differs = {differs} [{time.perf_counter() - start:.0f} s]")
    return {"same": same, "differs": differs}


MEMORY_CHILD = r"""
import json, sys
import torch
from grpo_lab.lm.build import build_loop
from grpo_lab.lm.train_config import TrainConfig
from grpo_lab.lm.memory import ModelShape, estimate_memory, longest_prompt
from grpo_lab.lm.models import load_policy
from grpo_lab.lm.tasks import load_problems

G, P, T, m = json.loads(sys.argv[1])
model, tokenizer = load_policy("smollm2-135m")
problems = load_problems("add1", 200, seed=0)
config = TrainConfig(G=G, prompts_per_step=P, max_completion_length=T, micro_batch_size=m, steps=2,
                     temperature=0.7, lr=1e-5)
status = lambda key: int(next(l for l in open("/proc/self/status") if l.startswith(key)).split()[1]) * 1024
open("/proc/self/clear_refs", "w").write("5")  # peak RSS (VmHWM) := current RSS, the model loaded
base = status("VmRSS")
loop = build_loop(config, model, tokenizer, problems)
estimate = estimate_memory(ModelShape.of(model), loop.config, longest_prompt(tokenizer, loop.task.prompt_of.values()))
list(loop.run())
print(json.dumps({"measured": status("VmHWM") - base, "estimate": estimate.new}))
"""


def memory_calibration() -> dict[str, Any]:
    """Estimate vs measured peak RSS of 2 real SmolLM2 steps, in a fresh process per shape."""
    from grpo_lab.lm.memory import CALIBRATION, gib

    ratios = []
    for G, P, T, m in ((4, 2, 8, None), (8, 4, 8, 8)):
        out = subprocess.run([sys.executable, "-c", MEMORY_CHILD, json.dumps([G, P, T, m])], cwd=REPO,
                             capture_output=True, text=True, timeout=1800)
        if out.returncode != 0:
            print(f"  memory run G={G} P={P} failed: {out.stderr[-500:]}")
            continue
        row = json.loads(out.stdout.strip().splitlines()[-1])
        ratios.append(row["measured"] / row["estimate"])
        print(f"  SmolLM2 G={G} P={P} T={T} micro-batch={m}: measured {gib(row['measured'])} above the loaded "
              f"model, estimated {gib(row['estimate'])} (measured / estimated = {ratios[-1]:.2f})")
    print(f"memory guard calibration: {CALIBRATION}")
    return {"ratios": ratios}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="skip SmolLM2 (determinism, memory); fewer answers")
    parser.add_argument("--examples", type=int, default=None, help="fuzzed completions (default 300, quick 60)")
    parser.add_argument("--depth", type=int, default=40, help="deepest LaTeX nesting fuzzed")
    parser.add_argument("--timeout", type=float, default=rewards.VERIFY_TIMEOUT_S, help="math-verify timeout (s)")
    args = parser.parse_args()
    examples = args.examples or (60 if args.quick else 300)
    start = time.perf_counter()

    inputs = bad_inputs()
    answers = hostile_answers(examples, args.depth, args.timeout)
    print("faults:")
    with single_thread():  # as in the tests: tiny tensors, and the crash child runs on one thread too
        tally = faults(("bandit", "lm"))
    determinism = None if args.quick else smollm2_determinism()
    memory = None if args.quick else memory_calibration()

    print("\n=============================== reliability ===============================")
    print(f"bad inputs tried / clear errors      {inputs['tried']} / {inputs['clear']}")
    print(f"faults injected / recovered          {tally['injected']} / {tally['recovered']}")
    print(f"hostile answers scored / raised      {answers['scored']} / {answers['raised']}")
    print(f"worst reward latency                 {answers['warm_s']:.2f} s warm worker, {answers['cold_s']:.2f} s "
          f"with a restart (timeout {args.timeout} s); extraction of 100k characters {answers['extraction_s']:.2f} s")
    print(f"answers with extraction too slow     {answers['too_slow']}")
    print(f"runs resumed / bit-identical         {tally['resumed']} / {tally['identical']}")
    print(f"data lost                            {tally['lost']} steps")
    if determinism:
        print(f"SmolLM2 same seed / other seed       identical: {determinism['same']} / differs: "
              f"{determinism['differs']}")
    if memory and memory["ratios"]:
        print(f"memory measured / estimated          {', '.join(f'{r:.2f}' for r in memory['ratios'])}")
    print(f"({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
