"""How many real artefacts of each kind the parsers and the launch triage read as a human expert does.

Runs every file of tests/fixtures/real/ through its parser or rule (tests/unit/realcorpus.py) and
prints, per kind, the files, how many read as expected, and how many have no misreading among the
fields that parser version has at all (the fair figure for an older checkout); with --show, the
mismatches. With
--src DIR the package is imported from DIR instead (e.g. an older checkout's src/, to measure the
difference a parser change makes):

    .venv/bin/python benchmarks/real_corpus.py
    .venv/bin/python benchmarks/real_corpus.py --src /tmp/main-checkout/src --show
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=Path, help="import vllm_acceptance from this directory")
    parser.add_argument("--show", action="store_true", help="print each mismatch")
    args = parser.parse_args()
    if args.src:
        sys.path.insert(0, str(args.src.resolve()))
    sys.path.insert(0, str(ROOT / "tests" / "unit"))
    import realcorpus  # noqa: PLC0415 - after the path is set

    started = time.perf_counter()
    files: Counter[str] = Counter()
    good: Counter[str] = Counter()
    fair: Counter[str] = Counter()
    failures = []
    for entry in realcorpus.entries():
        outcome = realcorpus.evaluate(entry)
        files[entry.kind] += 1
        if outcome.ok:
            good[entry.kind] += 1
        else:
            failures.append(outcome)
        if not outcome.misreadings:
            fair[entry.kind] += 1
    elapsed = time.perf_counter() - started
    import vllm_acceptance  # noqa: PLC0415

    print(f"package: {Path(vllm_acceptance.__file__).parent}")
    print(f"{'kind':<18} {'files':>5} {'as expected':>12} {'no misreading':>14}")
    for kind in sorted(files):
        print(f"{kind:<18} {files[kind]:>5} {good[kind]:>12} {fair[kind]:>14}")
    print(f"{'all':<18} {sum(files.values()):>5} {sum(good.values()):>12} {sum(fair.values()):>14}"
          f"   ({elapsed:.2f} s)")
    if args.show:
        for outcome in failures:
            print(f"\n{outcome.entry.name}:")
            for line in outcome.mismatches:
                print(f"  {line[:300]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
