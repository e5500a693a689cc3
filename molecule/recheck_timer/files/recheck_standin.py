#!/usr/bin/env python3
"""STAND-IN for `vllm-acceptance recheck` in the recheck_timer molecule scenario (the real re-check needs a served
deployment and a signed run). It takes the same arguments, writes a directory of its own under
reports/<inventory>/rechecks/ (as the re-check does), says whether the secret of the environment file reached it
(never its value), and exits with the exit code of the verdict it is told (recheck/outcome.py RECHECK_EXIT_CODES).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

EXIT_CODES = {"still_accepted": 0, "drifted": 50, "reopen": 60, "incomplete": 40}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--baseline", required=True)
    parser.add_argument("-i", dest="inventory", required=True)
    parser.add_argument("--verdict", choices=sorted(EXIT_CODES), required=True)
    args = parser.parse_args()
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = Path("reports") / Path(args.inventory).name / "rechecks" / f"{stamp}-{os.getpid()}"
    out.mkdir(parents=True)
    (out / "recheck.json").write_text(json.dumps({"verdict": args.verdict, "baseline_run": args.baseline,
                                                  "stand_in": True}))
    print(f"stand-in re-check of {args.baseline}: {args.verdict}; wrote {out}")
    print(f"secret from the environment file reached the re-check: {'yes' if os.environ.get('VLLM_API_KEY') else 'no'}")
    return EXIT_CODES[args.verdict]


if __name__ == "__main__":
    sys.exit(main())
