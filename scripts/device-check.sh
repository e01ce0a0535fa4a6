#!/usr/bin/env bash
# The GPU device check (docs/gpu.md), for both GPU paths: LibTorch (`--features tch`, built
# against the GPU machine's torch) first, then PyTorch (diffusers) on the same shapes, then
# CubeCL (`--features cuda`) with its kernel compilation and autotuning watched, the default
# autotune level against `minimal`. Per path: `tpgrpo doctor`, the MMDiT bench at SD3.5-medium
# size (512 px, 333 text tokens; batch 2 in f32 and bf16, batch 8 in bf16), two TP-GRPO epochs at
# SD3.5-medium size in bf16 (time per phase), 3 toy epochs; with two or more GPUs the gradient
# all-reduce and 2 toy epochs on two replicas (cuda). Each step runs under its own timeout,
# printing as it goes, and is skipped when it could overrun the budget; then one table.
#
#   scripts/device-check.sh [CARRY]   (default gpu-carry/, as docs/gpu.md builds it:
#       CARRY/tch/ and CARRY/cuda/ each with tpgrpo, train_sd3, mmdit, epoch, flux (.xz ok),
#       CARRY/cuda/all_reduce, and CARRY/wheels/ with diffusers for the PyTorch rows)
#
# BUDGET (default 540) caps the seconds of all steps, so that the check with the machine's start
# fits in 12 minutes of device time. Run from the repository root (models/toy is read from
# there). Logs go to $OUT or ./device-logs.
set -u
carry=${1:-gpu-carry}
out=${OUT:-device-logs}
budget=${BUDGET:-540}
mkdir -p "$out"
for f in "$carry"/*/*.xz; do [ -e "$f" ] && xz -dkf "$f"; done
chmod +x "$carry"/*/* 2>/dev/null

peak_mib() { # the largest memory.used sample of the step
  sort -n "$out/mem.$1" 2>/dev/null | tail -1
}

rows=()
ok=()
step() { # step NAME SECONDS COMMAND...: runs COMMAND under `timeout SECONDS` unless over budget
  local name=$1 limit=$2
  shift 2
  if [ $((SECONDS + limit)) -gt "$budget" ]; then
    echo "== $name: skipped, ${limit}s would pass the ${budget}s budget (at ${SECONDS}s)"
    rows+=("$(printf '%-26s %-14s' "$name" "skipped")")
    return 1
  fi
  echo "== $name (limit ${limit}s, at ${SECONDS}s): $*"
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
  rows+=("$(printf '%-26s %-14s %4ss  peak %6s MiB' "$name" "$status" $((SECONDS - start)) \
    "$(peak_mib "$name")")")
  [ "$rc" = 0 ]
}

# watch LOG: every 10 s, how many kernels CubeCL has compiled and autotune lines it has logged.
watch_cubecl() {
  while sleep 10; do
    echo "   ... cubecl: $(grep -c START_KERNEL_COMPILATION "$1" 2>/dev/null) kernels compiled," \
      "$(grep -ci autotune "$1" 2>/dev/null) autotune lines"
  done
}

# bench_path PATH [VAR=VALUE...]: the steps every GPU path runs, with the binaries of CARRY/PATH
# in the environment VAR=VALUE.
bench_path() {
  local p=$1 bin=$carry/$1
  shift
  local run=(env "$@")
  step "$p-doctor" 90 "${run[@]}" "$bin"/tpgrpo doctor --stall-secs 15 || return
  step "$p-mmdit-b2-f32" 75 "${run[@]}" BENCH_ITERS=5 "$bin"/mmdit sd35-medium 2 f32
  step "$p-mmdit-b2-bf16" 75 "${run[@]}" BENCH_ITERS=5 "$bin"/mmdit sd35-medium 2 bf16
  step "$p-mmdit-b8-bf16" 60 "${run[@]}" BENCH_ITERS=3 "$bin"/mmdit sd35-medium 8 bf16
  step "$p-epoch-sd35m-bf16" 80 "${run[@]}" "$bin"/epoch sd35-medium 8 bf16
  step "$p-toy-3-epochs" 60 "${run[@]}" "$bin"/train_sd3 --set epochs=3 --set eval_every=3 \
    --out "$out/toy-$p"
  # FLUX.1-dev's transformer at 512 px (bf16, batch 1): last, run when the budget allows.
  [ -x "$bin/flux" ] && step "$p-flux-dev-b1-bf16" 90 "${run[@]}" BENCH_ITERS=3 "$bin"/flux \
    flux1-dev 1 bf16
  return 0 # the doctor passed
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
python=$(command -v python3)
torch_lib=$("$python" -c "import torch, os; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))" 2>/dev/null)
echo "== torch $("$python" -c "import torch; print(torch.__version__, torch.cuda.is_available())" 2>/dev/null), lib $torch_lib"

# 1. LibTorch: the binaries link libtorch at run time from the machine's torch.
if [ -x "$carry/tch/tpgrpo" ] && [ -n "$torch_lib" ]; then
  bench_path tch "LD_LIBRARY_PATH=$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  echo "== tch: no $carry/tch/tpgrpo or no importable torch; LibTorch rows skipped"
fi

# 2. PyTorch on the same shapes (diffusers from the carried wheel when the machine lacks it).
if ! "$python" -c "import diffusers" 2>/dev/null && ls "$carry"/wheels/*.whl >/dev/null 2>&1; then
  "$python" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$carry"/wheels/*.whl &&
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
if "$python" -c "import diffusers, peft" 2>/dev/null; then
  for dtype in bf16 tf32; do
    step "torch-mmdit-b2-$dtype" 60 "$python" benches/torch_mmdit.py --size sd35-medium \
      --batch 2 --device cuda --dtype "$dtype" --iters 5
  done
else
  echo "== torch: diffusers/peft not importable; PyTorch rows skipped (carry the diffusers wheel)"
fi

# 3. CubeCL: compilation and autotune progress from CUBECL_DEBUG_LOG; its default autotune level
# on the batch-2 bf16 bench against `minimal` on an empty cache.
if [ -x "$carry/cuda/tpgrpo" ]; then
  export TPGRPO_CACHE_DIR="$out/cache" CUBECL_DEBUG_LOG="$out/cubecl.log"
  watch_cubecl "$CUBECL_DEBUG_LOG" &
  watcher=$!
  if bench_path cuda; then
    step cuda-mmdit-b2-bf16-minimal 75 env TPGRPO_CACHE_DIR="$out/cache-minimal" \
      CUBECL_AUTOTUNE_LEVEL=minimal BENCH_ITERS=5 "$carry/cuda/mmdit" sd35-medium 2 bf16
    gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
    if [ "$gpus" -ge 2 ]; then
      BENCH_ITERS=5 step cuda-all-reduce-sd35m-lora 60 "$carry/cuda/all_reduce" 2
      step cuda-toy-2-epochs-2-gpus 90 "$carry/cuda/train_sd3" --devices 2 --set epochs=2 \
        --set eval_every=2 --out "$out/toy-2"
    fi
  fi
  kill "$watcher" 2>/dev/null
  echo "== cubecl: $(grep -c START_KERNEL_COMPILATION "$CUBECL_DEBUG_LOG" 2>/dev/null) kernels compiled in all"
else
  echo "== cuda: no $carry/cuda/tpgrpo; CubeCL rows skipped"
fi

echo
echo "== device check $(date -u +%F) on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), ${SECONDS}s"
printf '%s\n' "${rows[@]}"
for f in "$out"/*.log; do
  case $f in *cubecl.log) continue ;; esac
  grep -H -E "^(toy forward|LoRA forward|forward|mmdit bench|flux bench|toy epoch)|first .* median|^epoch|^ +[12] |held-out|all-reduce" "$f"
done
