#!/usr/bin/env bash
# The GPU device check (docs/gpu.md): `tpgrpo doctor`, the MMDiT bench at SD3.5-medium size
# (batch 2 in f32 and bf16, batch 8 in bf16), PyTorch on the same shapes when diffusers and peft
# import, two TP-GRPO epochs at SD3.5-medium size in bf16 (time per phase), 3 toy epochs, and
# with two or more GPUs the gradient all-reduce at SD3.5-medium LoRA size and 2 toy epochs on
# two replicas; each step under its own timeout (580 s in all on one GPU, a few minutes when
# nothing stalls), printing as it goes, then one table.
#
#   scripts/device-check.sh [BIN_DIR]   (default gpu-carry/: tpgrpo, train_sd3, and the bench
#                                        binaries mmdit, epoch and all_reduce; .xz ok)
#
# Run from the repository root (models/toy is read from there). Logs go to $OUT or ./device-logs.
set -u
bin=${1:-gpu-carry}
out=${OUT:-device-logs}
mkdir -p "$out"
for f in "$bin"/*.xz; do [ -e "$f" ] && xz -dkf "$f"; done
chmod +x "$bin"/tpgrpo "$bin"/train_sd3 "$bin"/mmdit "$bin"/epoch "$bin"/all_reduce 2>/dev/null
export TPGRPO_CACHE_DIR="$out/cache"

peak_mib() { # the largest memory.used sample of the running step
  sort -n "$out/mem.$1" 2>/dev/null | tail -1
}

rows=()
step() { # step NAME SECONDS COMMAND...
  local name=$1 limit=$2
  shift 2
  echo "== $name (limit ${limit}s): $*"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 250 \
      >"$out/mem.$name" 2>/dev/null &
    local smi=$!
  fi
  local start=$SECONDS
  timeout "$limit" "$@" 2>&1 | grep --line-buffered -v XDG_RUNTIME_DIR | tee "$out/$name.log"
  local rc=${PIPESTATUS[0]}
  [ -n "${smi:-}" ] && kill "$smi" 2>/dev/null
  local status=ok
  [ "$rc" = 124 ] && status="timeout ${limit}s"
  [ "$rc" != 0 ] && [ "$rc" != 124 ] && status="exit $rc"
  rows+=("$(printf '%-22s %-12s %6ss  peak %6s MiB' "$name" "$status" $((SECONDS - start)) "$(peak_mib "$name")")")
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
step doctor 75 "$bin"/tpgrpo doctor --stall-secs 15
BENCH_ITERS=5 step mmdit-sd35m-b2-f32 90 "$bin"/mmdit sd35-medium 2 f32
BENCH_ITERS=5 step mmdit-sd35m-b2-bf16 90 "$bin"/mmdit sd35-medium 2 bf16
BENCH_ITERS=3 step mmdit-sd35m-b8-bf16 80 "$bin"/mmdit sd35-medium 8 bf16
if python3 -c "import diffusers, peft" 2>/dev/null; then
  for dtype in bf16 tf32; do
    step "torch-sd35m-b2-$dtype" 45 python3 benches/torch_mmdit.py --size sd35-medium \
      --batch 2 --device cuda --dtype "$dtype" --iters 5
  done
else
  echo "== torch: diffusers/peft not importable; PyTorch rows skipped (carry their wheels)"
fi
step epoch-sd35m-bf16 80 "$bin"/epoch sd35-medium 8 bf16
step toy-3-epochs 75 "$bin"/train_sd3 --set epochs=3 --set eval_every=3 --out "$out/toy"
gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
if [ "$gpus" -ge 2 ]; then
  BENCH_ITERS=5 step all-reduce-sd35m-lora 60 "$bin"/all_reduce 2
  step toy-2-epochs-2-gpus 90 "$bin"/train_sd3 --devices 2 --set epochs=2 --set eval_every=2 \
    --out "$out/toy-2"
else
  echo "== data-parallel steps skipped: $gpus GPU(s)"
fi

echo
echo "== device check $(date -u +%F) on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
printf '%s\n' "${rows[@]}"
grep -h -E "^(toy forward|LoRA forward|toy epoch)|first .* median|^epoch|^ +[12] |held-out|all-reduce" \
  "$out"/*.log
