#!/usr/bin/env bash
# GPU checks, for a machine with a CUDA GPU (make gpu-check). Never part of `make test` or CI.
#
#   1. the CUDA tests of tests/engines/test_devices.py (greedy parity of chain and tree SpS with HF generate on the
#      HF and lean runners; the tree sampler's chi-square on a CUDA pair, with a wrong rule that must fail);
#   2. specrepro-bench on SmolLM2-shaped targets (135M, and the 1.7B shape) built with RANDOM
#      weights from the config and tokenizer in MODEL_DIR (default: the converted offline target), in
#      bfloat16 on cuda: ms per token of our ArS and SpS (lean runner, and the HF runner where transformers
#      is new enough) beside HF generate and assisted generation, and the cost of one target pass over 1..65 tokens (v(K), token-tree sizes).
#      Random weights make acceptance and tau meaningless: read the pass costs and plain-decoding speed
#      only; tau is a property of the weights and is measured on the CPU (specrepro-tree-tau).
#
# OUT: where results go (default figures/gpu-check). SIZES: which shapes (default "135m 1.7b").
set -uo pipefail
OUT=${OUT:-figures/gpu-check}
SIZES=${SIZES-135m 1.7b}
PY=${PY:-python3}
BIN=$(dirname "$PY")
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT"
MODEL_DIR=${MODEL_DIR:-$($PY -c 'import specrepro as sr; print(sr.specrepro_home() / "models" / "smollm2-135m-instruct")')}
status=0

$PY - <<'EOF'
import torch, transformers
print("torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.version.cuda)
print("gpu", torch.cuda.get_device_name() if torch.cuda.is_available() else "none visible")
EOF

# specrepro's HF runner needs transformers >= 5.24 (the `cache=` forward argument); on an older one (a GPU
# image's own) only the lean runner's cases and HF's own generate run
if $PY -c 'import sys, transformers; from packaging.version import Version as V; sys.exit(V(transformers.__version__) < V("5.24"))'; then
  select=cuda; runners=${RUNNERS:-hf,lean}
else
  echo "transformers is older than specrepro's 5.24: the HF runner's cases are left out"
  select="cuda and not hf"; runners=lean
fi
$PY -m pytest -q -p no:cacheprovider tests/engines/test_devices.py -k "$select" -rs 2>&1 | tee "$OUT/pytest-cuda.log" || status=1

for size in $SIZES; do
  dir=$(mktemp -d)/smollm2-$size-random
  $PY - "$MODEL_DIR" "$dir" "$size" <<'EOF' || { status=1; continue; }
import shutil, sys
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

src, out, size = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
cfg = AutoConfig.from_pretrained(src)
if size == "1.7b":  # SmolLM2-1.7B's shape (same vocabulary and tokenizer)
    cfg.update(dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=24, num_attention_heads=32,
                    num_key_value_heads=32))
elif size != "135m":
    sys.exit(f"unknown size {size!r}: 135m or 1.7b")
torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
with torch.device(device):
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
model.save_pretrained(out)
for f in src.iterdir():
    if f.name.startswith(("tokenizer", "chat_template", "special_tokens")):
        shutil.copy(f, out / f.name)
print(f"{size}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M random parameters in {out}")
EOF
  device=cuda; $PY -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' || device=cpu
  $BIN/specrepro-bench --target "$dir" --draft lookup --ks ${KS:-1,2,4,8} --trees ${TREES:-3x4,4x5/32,6x6/64} \
      --prompts news --n-prompts ${N_PROMPTS:-2} --reps ${REPS:-2} --max-new-tokens ${NEW_TOKENS:-64} --modes greedy \
      --runners $runners --dtype bfloat16 --device $device --out "$OUT/bench-${size/./_}" 2>&1 \
      | grep -v -E "it/s\]|s/it\]" | tee "$OUT/bench-${size/./_}.log" || status=1
  rm -rf "$(dirname "$dir")"
done
exit $status
