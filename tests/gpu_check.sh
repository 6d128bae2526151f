#!/usr/bin/env bash
# The long GPU checks, for a CUDA machine with specrepro installed (its console scripts beside $PY) and the
# offline target converted. On a short GPU lease of a bare image use tests/gpu_session.sh instead (make
# gpu-check): one command, per-stage timeouts, no install; it calls this script's notebook stage where
# papermill is installed. Never part of `make test` or CI.
#
#   0. what runs where: GPU, driver, torch/CUDA/transformers versions, the commit -> $OUT/versions.txt
#   1. the CUDA tests with SPECREPRO_REQUIRE_CUDA=1 (a missing GPU fails them, nothing is skipped):
#      tests/engines/test_devices.py -k cuda (greedy parity of chain and tree SpS with HF generate on the HF,
#      lean and graph-captured static runners; every draft kind, chain and tree; the tree sampler's chi-square
#      on CUDA pairs and the feature draft, a wrong rule that must fail) and tests/engines/test_static.py;
#   2. every notebook with the gpu-test profile's tiny hub models (a Hugging Face cache of tiny random Llamas
#      with the real SmolLM2 tokenizer, XSum- and HumanEval-shaped local files: tests/experiments/
#      test_gpu_profile.py's fixtures) on device $DEVICE (02-04; 01 has no device setting) -> $OUT/notebooks/;
#   3. specrepro-bench on SmolLM2-shaped targets (135M, and the 1.7B shape) built with RANDOM weights from the
#      config and tokenizer in MODEL_DIR, bfloat16: ArS/SpS on the HF and lean runners beside HF generate and
#      assisted generation, and the cost of one pass over 1..65 tokens. Random weights make tau meaningless:
#      read the pass costs and plain-decoding speed only;
#   4. the headline on the REAL offline target with the shipped drafts: tests/gpu_bench.py
#      (HF generate eager and with a static cache, our ArS on the eager and graph runners, SpS with every
#      draft, chain K = 2, 4, 8 and a 4x6/32 tree, greedy and T = 1, held-out news and HumanEval prompts,
#      paired ratios with CIs; v(K) per runner and c per draft) -> $OUT/headline/headline.{md,json}.
# Each stage's status goes to $OUT/stages.txt; the script exits non-zero if any stage failed.
#
# Environment: OUT (default figures/gpu-check); DEVICE (cuda; `DEVICE=cpu` is the CPU proof: the same stages
# uncaptured at tiny sizes, no random-shape bench); SIZES (stage 3's shapes, default "135m 1.7b", "" skips it);
# STAGES (default "0 1 2 3 4"); N_PROMPTS, NEW_TOKENS, REPS (stage 4: 5, 128, 3; CPU proof 1, 8, 1);
# HEAD_TARGET (stage 4's target, default smollm2-135m-instruct, the converted offline weights) and
# HEAD_RANDOM=1 (its weights random, from HEAD_TARGET's config: a directory holding only config and tokenizer,
# e.g. the one tests/gpu_carry.sh packs when the weights cannot travel; tau and speedups are then meaningless);
# HEAD_RUNNERS (default lean,graphs-cuda; add graphs-compile to time torch.compile's graphs: minutes of
# compiling), HEAD_DRAFTS; TOKENIZER_DIR (stage 2's tokenizer, default the converted offline target's).
set -uo pipefail
OUT=${OUT:-figures/gpu-check}
DEVICE=${DEVICE:-cuda}
PY=${PY:-python3}
BIN=$(dirname "$PY")
STAGES=${STAGES:-0 1 2 3 4}
if [ "$DEVICE" = cpu ]; then
  SIZES=${SIZES-}; N_PROMPTS=${N_PROMPTS:-1}; NEW_TOKENS=${NEW_TOKENS:-8}; REPS=${REPS:-1}
  HEAD_KS=${HEAD_KS:-2}; HEAD_TREES=${HEAD_TREES:-2x2}; HEAD_DTYPE=float32
else
  SIZES=${SIZES-135m 1.7b}; N_PROMPTS=${N_PROMPTS:-5}; NEW_TOKENS=${NEW_TOKENS:-128}; REPS=${REPS:-3}
  HEAD_KS=${HEAD_KS:-2,4,8}; HEAD_TREES=${HEAD_TREES:-4x6/32}; HEAD_DTYPE=bfloat16
  export SPECREPRO_REQUIRE_CUDA=1
fi
export PYTHONUNBUFFERED=1 MPLBACKEND=agg PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" SPECREPRO_STRICT_GRAPHS=1
mkdir -p "$OUT"
: > "$OUT/stages.txt"
MODEL_DIR=${MODEL_DIR:-$($PY -c 'import specrepro as sr; print(sr.specrepro_home() / "models" / "smollm2-135m-instruct")')}
status=0
stage() {  # stage NUMBER NAME: whether to run it
  case " $STAGES " in *" $1 "*) echo "== stage $1: $2 ($(date -u +%H:%M:%S))"; return 0;; *) return 1;; esac
}
done_stage() {  # done_stage NUMBER NAME RC SECONDS
  echo "stage $1 $2: $([ "$3" = 0 ] && echo ok || echo "FAILED (rc $3)") in $4 s" | tee -a "$OUT/stages.txt"
  [ "$3" = 0 ] || status=1
}

if stage 0 versions; then
  t=$SECONDS
  { $PY - <<'EOF'
import platform, subprocess, torch, transformers
print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__,
      "python", platform.python_version())
print("gpu", torch.cuda.get_device_name() if torch.cuda.is_available() else "none visible")
from specrepro.engines.machine import describe_cpu
print("host cpu", describe_cpu())
EOF
    git rev-parse HEAD 2>/dev/null | sed 's/^/commit /'
    git status --porcelain 2>/dev/null | head -20 | sed 's/^/dirty: /'
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    date -u +"date %Y-%m-%dT%H:%M:%SZ"; } 2>&1 | tee "$OUT/versions.txt"
  done_stage 0 versions "${PIPESTATUS[0]}" $((SECONDS - t))
fi

if stage 1 "CUDA tests"; then
  t=$SECONDS
  # the HF runner passes its cache as `past_key_values=` on transformers < 5.24: its cases run everywhere
  select=cuda; RUNNERS=${RUNNERS:-hf,lean}
  [ "$DEVICE" = cpu ] && static_k="not sampled" || static_k=""
  $PY -m pytest -q -p no:cacheprovider tests/engines/test_devices.py -k "$select" -rs 2>&1 | tee "$OUT/pytest-cuda.log"
  rc=${PIPESTATUS[0]}
  $PY -m pytest -q -p no:cacheprovider tests/engines/test_static.py ${static_k:+-k "$static_k"} -rs 2>&1 \
    | tee "$OUT/pytest-static.log"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  done_stage 1 "CUDA tests" "$rc" $((SECONDS - t))
fi

if stage 2 "notebooks (gpu-test models, device $DEVICE)"; then
  t=$SECONDS
  work=$(mktemp -d)
  $PY - "$work" <<'EOF'
import os, sys
from pathlib import Path

from transformers import AutoTokenizer

sys.path.insert(0, "tests/experiments")
from test_gpu_profile import DRAFT_ID, TARGET_ID, cache_tiny_model, write_datasets  # the tests' own fixtures

from specrepro.models import offline_target_dir

root = Path(sys.argv[1])
tokenizer = AutoTokenizer.from_pretrained(os.environ.get("TOKENIZER_DIR") or offline_target_dir())
cache_tiny_model(root / "hub", TARGET_ID, seed=0, layers=5, tokenizer=tokenizer)
cache_tiny_model(root / "hub", DRAFT_ID, seed=1, layers=2, tokenizer=tokenizer)
write_datasets(root / "datasets")
EOF
  rc=$?
  if [ $rc = 0 ]; then
    export_env="HF_HUB_CACHE=$work/hub HF_HUB_OFFLINE=1 HF_DATASETS_CACHE=$work/datasets-cache SPECREPRO_DATASETS_DIR=$work/datasets"
    env $export_env $BIN/specrepro-reproduce --profile gpu-test --output-root "$OUT/notebooks" --force \
        --only 00_train_drafts 01_losslessness 2>&1 | tee "$OUT/notebooks.log"
    rc=${PIPESTATUS[0]}
    env $export_env $BIN/specrepro-reproduce --profile gpu-test --output-root "$OUT/notebooks" --force \
        --only 02_lookahead_sweep 03_table1 04_drafts --set device=$DEVICE 2>&1 | tee -a "$OUT/notebooks.log"
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  fi
  rm -rf "$work"
  done_stage 2 "notebooks" "$rc" $((SECONDS - t))
fi

if [ -n "$SIZES" ] && stage 3 "bench on random SmolLM2 shapes ($SIZES)"; then
  for size in $SIZES; do
    t=$SECONDS
    dir=$(mktemp -d)/smollm2-$size-random
    $PY - "$MODEL_DIR" "$dir" "$size" <<'EOF'
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
    rc=$?
    if [ $rc = 0 ]; then
      $BIN/specrepro-bench --target "$dir" --draft lookup --ks ${KS:-1,2,4,8} --trees ${TREES:-3x4,4x5/32,6x6/64} \
          --prompts news --n-prompts 2 --reps 2 --max-new-tokens 64 --modes greedy \
          --runners ${RUNNERS:-lean} --dtype bfloat16 --device $DEVICE --out "$OUT/bench-${size/./_}" 2>&1 \
          | grep -v -E "it/s\]|s/it\]" | tee "$OUT/bench-${size/./_}.log"
      rc=${PIPESTATUS[0]}
    fi
    rm -rf "$(dirname "$dir")"
    done_stage 3 "bench-$size" "$rc" $((SECONDS - t))
  done
fi

if stage 4 "headline on the real target, shipped drafts"; then
  t=$SECONDS
  $PY tests/gpu_bench.py --target "${HEAD_TARGET:-smollm2-135m-instruct}" ${HEAD_RANDOM:+--random-weights} \
      --device "$DEVICE" --dtype $HEAD_DTYPE --n-prompts "$N_PROMPTS" --runners "${HEAD_RUNNERS:-lean,graphs-cuda}" \
      --drafts "${HEAD_DRAFTS:-lookup,feature,heads,small,lookup+feature,truncated:4}" \
      --max-new-tokens "$NEW_TOKENS" --reps "$REPS" --ks "$HEAD_KS" --trees "$HEAD_TREES" \
      --out "$OUT/headline" 2>&1 | tee "$OUT/headline.log"
  done_stage 4 headline "${PIPESTATUS[0]}" $((SECONDS - t))
fi
cat "$OUT/stages.txt"
exit $status
