"""Console scripts declared in pyproject.toml; `python -m <module>` runs the same mains.

specrepro-reproduce, specrepro-bench, specrepro-tune, specrepro-tree-tau, specrepro-plots and
specrepro-drafts {train, longrun, measure, taucard, datastore}. Each tool's module is imported only when it runs.
"""
from __future__ import annotations

import importlib
import sys

TOOLS = {
    "reproduce": "specrepro.experiments.reproduce",
    "bench": "specrepro.bench.harness",
    "tune": "specrepro.tuning.tune",
    "tree-tau": "specrepro.experiments.tree_tau",
    "plots": "specrepro.experiments.plots",
}
DRAFT_TOOLS = {
    "train": "specrepro.training.train",
    "longrun": "specrepro.training.longrun",
    "measure": "specrepro.experiments.measure_drafts",
    "taucard": "specrepro.training.taucard",
    "datastore": "specrepro.training.datastore_build",
}


def _run(module: str, argv: list[str] | None) -> int:
    # the mains return their results (a report dict, rows) for callers in Python; a process exits 0 on success
    result = importlib.import_module(module).main(argv)
    return result if isinstance(result, int) else 0


def reproduce(argv=None) -> int:
    return _run(TOOLS["reproduce"], argv)


def bench(argv=None) -> int:
    return _run(TOOLS["bench"], argv)


def tune(argv=None) -> int:
    return _run(TOOLS["tune"], argv)


def tree_tau(argv=None) -> int:
    return _run(TOOLS["tree-tau"], argv)


def plots(argv=None) -> int:
    return _run(TOOLS["plots"], argv)


def drafts(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in DRAFT_TOOLS:
        print(f"usage: specrepro-drafts {{{','.join(DRAFT_TOOLS)}}} [options]  (each command's --help says more)",
              file=sys.stderr)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    return _run(DRAFT_TOOLS[argv[0]], argv[1:])
