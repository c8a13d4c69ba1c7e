"""Run the units of "when is lag free?" (the design: ``design.py`` beside this file) through the decided study's
runner (``studies/lag_decided/run.py``: the same ``run_unit``, provenance, locks and skipping of units that exist
or run elsewhere), and rebuild its summary::

    python studies/lag_free/run.py --part confirmatory --units 32 --threads 1   # part 1, until it stops
    python studies/lag_free/run.py --part drift --units 16                       # part 2 (exploratory)
    python studies/lag_free/run.py --part adaptive --units 8                     # part 3, once its budget is fixed
    python studies/lag_free/run.py --summary                                     # rebuild summary.json

Part 1 runs its arms pair by pair in seed order and asks before each unit whether its comparison has stopped at a
look (``summary.is_open``); once it has, no further seed runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
if str(ROOT) not in sys.path:   # run as a script from any folder
    sys.path.insert(0, str(ROOT))

from studies.lag_decided.design import unit_order  # noqa: E402
from studies.lag_decided.run import run_units, unit_arguments  # noqa: E402
from studies.lag_free import design  # noqa: E402
from studies.lag_free.summary import UNITS, is_open, rebuild_summary  # noqa: E402

PARTS = {"confirmatory": (design.ARMS, design.SEEDS, design.LR),
         "drift": (design.DRIFT_ARMS, design.DRIFT_SEEDS, design.LR),
         "adaptive": ((design.ADAPTIVE_ARM,), design.ADAPTIVE_SEEDS, design.ADAPTIVE_LR)}
"""Part → (its arms, its seeds, its lr)."""


def queue(part: str, out: Path) -> Iterator[tuple[str, int, float, int, Path, dict[str, Any]]]:
    """(arm, seed, lr, steps, folder, fields) of ``part``'s units in the design's order, for ``run_units``; part 1's
    end once its comparison has stopped, part 3's are refused while its budget is not fixed."""
    arms, seeds, lr = PARTS[part]
    fields = {arm: design.arm_fields(arm) for arm in arms}   # part 3 without its budget: a ValueError here
    for arm, seed in unit_order(list(arms), seeds):
        if part == "confirmatory" and not is_open(out):
            return
        yield arm, seed, lr, design.STEPS, out / UNITS[part], fields[arm]


def arguments() -> argparse.ArgumentParser:
    """The command line of this script."""
    parser = unit_arguments(argparse.ArgumentParser(description=__doc__.splitlines()[0]), HERE)
    parser.add_argument("--part", choices=list(PARTS), default="confirmatory")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = arguments().parse_args(argv)
    if args.summary:
        summary = rebuild_summary(args.out)
        print(json.dumps({"looks_reached": summary["confirmatory"]["looks_reached"],
                          "seeds_in": summary["confirmatory"]["seeds_in"]}))
        return
    run_units(queue(args.part, args.out), args.units, args.threads)


if __name__ == "__main__":
    main()
