"""CLI: specrepro-drafts train KIND --budget-minutes N [--seed S] [--out DIR] [--threads T]."""
from __future__ import annotations

import argparse
import sys

import torch

from .trainer import KINDS, train


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specrepro-drafts train", description=__doc__)
    parser.add_argument("kind", choices=KINDS)
    parser.add_argument("--budget-minutes", type=float, default=5.0, help="training wall time (data build excluded)")
    parser.add_argument("--max-steps", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="artifact root (default: $SPECREPRO_HOME/drafts)")
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the machine is shared)")
    args = parser.parse_args(argv)
    if args.budget_minutes <= 0:
        parser.error(f"--budget-minutes must be positive, got {args.budget_minutes}")
    torch.set_num_threads(args.threads)
    out = train(args.kind, target=args.target, budget_minutes=args.budget_minutes, max_steps=args.max_steps,
                seed=args.seed, root=args.out)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
