"""A draft model that disagrees with the lab model, for speculative decoding's faulty lab case (docs/lab.md
"Speculative decoding"; docs/checks.md quality.spec_acceptance).

The lab model (lab/build_model.py) is copied whole -- tokenizer, config, chat template -- and only its LM head is
rolled by one row: the draft's logit for token i is the lab model's logit for token i + 1, so its greedy choice is
always the token before the lab model's. Served as the lab model's `draft_model` speculator, every draft is
proposed and rejected at its first position: the acceptance a speculator for another model or revision gives
(vllm#51009 shows what that looks like on a real deployment). Run with the lab venv's python (torch, safetensors):

    PYTHONPATH=src python -m vllm_acceptance.lab.spec_draft --source .lab/models/tiny-agent --out DIR
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

WEIGHTS = "model.safetensors"
HEAD = "lm_head.weight"


def build_mismatched_draft(source: Path, out_dir: Path) -> Path:
    """Copy `source` to `out_dir` with its LM head rolled by one token; the same bytes for the same source."""
    import torch
    from safetensors.torch import load_file, save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        if item.is_file() and item.name != WEIGHTS:
            shutil.copy2(item, out_dir / item.name)
    tensors = load_file(str(source / WEIGHTS))
    if HEAD not in tensors:
        raise ValueError(f"{source / WEIGHTS}: no {HEAD} to roll (a model with tied embeddings needs another fault)")
    tensors[HEAD] = torch.roll(tensors[HEAD], shifts=-1, dims=0).contiguous()
    save_file(tensors, str(out_dir / WEIGHTS), metadata={"format": "pt"})
    return out_dir


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", required=True, type=Path, help="the lab model's directory")
    ap.add_argument("--out", required=True, type=Path, help="directory to write the draft model into")
    args = ap.parse_args(argv)
    print(build_mismatched_draft(args.source, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
