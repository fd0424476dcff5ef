#!/usr/bin/env bash
# The GPU check: run it on a CUDA machine that already has torch (e.g. the lent H200: Python 3.12,
# no network; the other packages come as wheels in .whl/, see below). Under 10 minutes:
#   1. the `gpu` tests (bf16 autocast, torch.compile, MFU on the reference target);
#   2. one BASELINE_S-second (default 300) baseline of experiments/gpt: tokens/s, MFU, peak
#      memory, training vs total seconds;
#   3. a 3-experiment overnight sweep on the GPU (SWEEP_BUDGET_S each, default 30): the share of
#      wall time spent inside training budgets.
# Figures go to stdout and to $OUT/gpu_check.txt when OUT is set.
#
# Wheels for the device (here, in the repo root; pip downloads for Python 3.12 / x86-64):
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl <each package of `pip install -e .` except torch, plus pytest, pluggy, iniconfig>
# then run with carry [".whl"]:  bash benchmarks/gpu_check.sh
# GPU_CHECK_ALLOW_CPU=1 runs the same steps on a CPU (tiny budgets) to check the script itself.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BASELINE_S=${BASELINE_S:-300}
SWEEP_BUDGET_S=${SWEEP_BUDGET_S:-30}
PY=${PYTHON:-python3}
[[ "$PY" == */* ]] && PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"  # keep a venv
REPORT=${OUT:-/tmp}/gpu_check.txt
: > "$REPORT"
say() { echo "$*" | tee -a "$REPORT"; }

if [[ -d .whl ]] && ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
  export PATH="/tmp/site/bin:$PATH"
else
  export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
fi
OVERNIGHT=("$PY" -c "from overnight.cli import main; main()")

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  if [[ -z "${GPU_CHECK_ALLOW_CPU:-}" ]]; then
    echo "no CUDA device visible to torch; set GPU_CHECK_ALLOW_CPU=1 to dry-run on a CPU" >&2
    exit 2
  fi
  say "DRY RUN on CPU (GPU_CHECK_ALLOW_CPU=1)"
  DEVICE=cpu
else
  DEVICE=cuda
  say "$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader)"
fi
say "torch $("$PY" -c 'import torch; print(torch.__version__, torch.version.cuda)')"

say "== 1. gpu tests"
"$PY" -m pytest -q -p no:cacheprovider -m gpu tests/test_gpt_target.py 2>&1 | tail -5 \
  | tee -a "$REPORT" || true

say "== 2. ${BASELINE_S}s baseline of experiments/gpt on $DEVICE"
WORK=$(mktemp -d)
cp -r experiments/gpt "$WORK/gpt"
t0=$(date +%s.%N)
(cd "$WORK/gpt" && OVERNIGHT_BUDGET_S=$BASELINE_S OVERNIGHT_DEVICE=$DEVICE \
   OVERNIGHT_DATA_DIR="$WORK/data" PYTHONUNBUFFERED=1 "$PY" train.py > "$WORK/baseline.log" 2>&1)
t1=$(date +%s.%N)
sed -n '/^---$/,$p' "$WORK/baseline.log" | tee -a "$REPORT"
"$PY" - "$WORK/baseline.log" "$t0" "$t1" <<'EOF' | tee -a "$REPORT"
import sys
lines = open(sys.argv[1]).read().split("\n---\n", 1)[-1].splitlines()
s = dict(line.split(":", 1) for line in lines if ":" in line)
s = {k.strip(): v.strip() for k, v in s.items()}
train, total = float(s["training_seconds"]), float(s["total_seconds"])
tokens = float(s["total_tokens_M"]) * 1e6
wall = float(sys.argv[3]) - float(sys.argv[2])
print(f"tokens/s {tokens / train:,.0f}  MFU {s['mfu_percent']} %  peak memory "
      f"{float(s['peak_memory_mb']) / 1024:.1f} GB  training {train:.1f} s of {total:.1f} s "
      f"total ({train / total:.1%}); process wall {wall:.1f} s")
EOF

say "== 3. a 3-experiment sweep on $DEVICE (budget ${SWEEP_BUDGET_S}s)"
"${OVERNIGHT[@]}" init "$WORK/night" >/dev/null
t0=$(date +%s.%N)
OVERNIGHT_DATA_DIR="$WORK/data" "${OVERNIGHT[@]}" run --target "$WORK/night" --experiments 3 \
  --budget "$SWEEP_BUDGET_S" --device "$DEVICE" --db "$WORK/o.db" --sweep gpucheck \
  > "$WORK/sweep.log" 2>&1 || { tail -40 "$WORK/sweep.log" | tee -a "$REPORT"; exit 1; }
t1=$(date +%s.%N)
"${OVERNIGHT[@]}" results --sweep gpucheck --db "$WORK/o.db" --format tsv | tee -a "$REPORT"
"$PY" - "$WORK/o.db" "$t0" "$t1" <<'EOF' | tee -a "$REPORT"
import sys
from overnight.runtime import Runtime
rt = Runtime(sys.argv[1])
sweep = rt.store.get_sweep("gpucheck")
runs = [e for e in rt.store.list_experiments(sweep.id) if e.summary]
train = sum(float(e.summary.get("training_seconds", 0)) for e in runs)
wall = float(sys.argv[3]) - float(sys.argv[2])
print(f"{len(runs)} runs, {train:.1f} s inside training budgets of {wall:.1f} s wall: "
      f"{train / wall:.1%} (autoresearch: ~92 %)")
EOF
say "report: $REPORT"
