#!/usr/bin/env bash
# The CLI's parallel flags under mpirun (ctest parallel_cli_np2 / _np4, label mpi):
#   sp-bench --check over every layout of the ranks, dense, block-sparse, radial and dynamic top-k,
#   with and without --cfg-parallel (exit 1 when a layout's output differs from one rank's);
#   sp-bench --check under Ulysses with its heads pipelined in 2 groups (--ulysses-head-groups 2), and
#   the flag refused without Ulysses alone or when it does not divide a rank's heads;
#   dit-bench --check (a tiny random model) under Ulysses, Ring, USP and CFG-parallel, dense, radial
#   and dynamic top-k;
#   generate (a tiny random model) with --ulysses / --ring / --cfg-parallel, latents and decoded
#   frames (the VAE decode split over the ring); vae-bench --check: the split decode of the tiny VAE
#   equals one rank's bit for bit; a degree product that is not the process count is an error
#   naming both.
# Usage: parallel_cli_check.sh MPIEXEC RANKS TESSEL WORK_DIR
set -euo pipefail
MPIEXEC="$1" RANKS="$2" TESSEL="$3" WORK="$4"
rm -rf "$WORK" && mkdir -p "$WORK"
run() { "$MPIEXEC" -n "$RANKS" --oversubscribe --allow-run-as-root "$@"; }

for mask in "dense" "block_sparse --density 0.3" "radial --grid 5x7x9" "dynamic_topk --density 0.4"; do
  for cfg in "" "--cfg-parallel"; do
    echo "== sp-bench --mask $mask $cfg"
    # shellcheck disable=SC2086
    run "$TESSEL" sp-bench --seq 203 --heads 4 --kv-heads 2 --head-dim 32 --block-q 16 --block-kv 8 --mask $mask \
      --steps 1 --warmup 0 --threads 1 --check $cfg | tee "$WORK/sp.log"
    grep -q " ok" "$WORK/sp.log"
    if grep -q "FAIL" "$WORK/sp.log"; then exit 1; fi
  done
done

echo "== sp-bench --ulysses $RANKS --ulysses-head-groups 2"
for mask in "dense" "radial --grid 5x7x9"; do
  # shellcheck disable=SC2086
  run "$TESSEL" sp-bench --seq 203 --heads 16 --kv-heads 8 --head-dim 32 --block-q 16 --block-kv 8 --mask $mask \
    --steps 1 --warmup 0 --threads 1 --check --ulysses "$RANKS" --ulysses-head-groups 2 | tee "$WORK/sp.log"
  grep -q " ok" "$WORK/sp.log"
  if grep -q "FAIL" "$WORK/sp.log"; then exit 1; fi
done
for bad in "--ring $RANKS --ulysses-head-groups 2|--ulysses-head-groups: expected 1 unless Ulysses runs alone" \
           "--ulysses $RANKS --ulysses-head-groups 3|ParallelConfig.ulysses_head_groups: expected a divisor of the"; do
  flags="${bad%%|*}" expected="${bad#*|}"
  echo "== sp-bench $flags (an error)"
  # shellcheck disable=SC2086
  if run "$TESSEL" sp-bench --seq 203 --heads 16 --kv-heads 8 --head-dim 32 --steps 1 --warmup 0 --threads 1 $flags \
       >"$WORK/bad.log" 2>&1; then
    echo "expected an error for $flags" >&2
    exit 1
  fi
  grep -q -- "$expected" "$WORK/bad.log"
done

half=$((RANKS / 2))
"$TESSEL" init-model --preset tiny --out "$WORK/tiny" >/dev/null

# dit-bench: the tiny model (2 heads) on an odd 5 x 3 x 5 patch grid under the layouts of the ranks,
# dense, radial and dynamic top-k (8 x 4 blocks); --check exits 1 when the whole output differs from
# one process's beyond fp32 rounding.
bench=(dit-bench --from-dir "$WORK/tiny/transformer" --frames 17 --height 48 --width 80 --text-tokens 7 --threads 1 --check)
blocks='{"block_size_q": 8, "block_size_kv": 4}'
for layout in "--ulysses 2 --ring $half" "--ring $RANKS" "--cfg-parallel --ring $half"; do
  for attention in "" "--sparse-attn-pattern radial" "--sparse-attn-pattern dynamic_topk --sparse-attn-topk 0.5"; do
    echo "== dit-bench $layout $attention"
    sparse=()
    if [ -n "$attention" ]; then sparse=(--sparse-attn-config "$blocks"); fi
    # shellcheck disable=SC2086
    run "$TESSEL" "${bench[@]}" $layout $attention "${sparse[@]}" | tee "$WORK/dit.log"
    grep -q "vs one process: rel-L2 .* ok" "$WORK/dit.log"
  done
done

common=(generate --model "$WORK/tiny" --prompt "a cat" --size 32x32 --frames 5 --steps 2 --guidance 4 --threads 1)
echo "== generate --cfg-parallel --ulysses $half"
run "$TESSEL" "${common[@]}" --cfg-parallel --ulysses "$half" --out "$WORK/parallel.safetensors"
test -s "$WORK/parallel.safetensors"

echo "== generate --ring $RANKS, frames decoded over the ring"
run "$TESSEL" "${common[@]}" --ring "$RANKS" --out "$WORK/split.png"
test -s "$WORK/split_00000.png" && test -s "$WORK/split_00004.png"

echo "== vae-bench --ring $RANKS --check"
run "$TESSEL" vae-bench --device cpu --preset tiny --ring "$RANKS" --check --frames 9 --height 56 --width 24 --iters 1 --warmup 0 \
  --threads 1 | tee "$WORK/vae.log"
grep -q "check: rel-L2 0 .* ok" "$WORK/vae.log"

echo "== a degree product that is not the process count"
if run "$TESSEL" "${common[@]}" --ring $((RANKS + 1)) --out "$WORK/bad.safetensors" >"$WORK/bad.log" 2>&1; then
  echo "expected an error for --ring $((RANKS + 1)) on $RANKS processes" >&2
  exit 1
fi
grep -q "processes mpirun started" "$WORK/bad.log"
echo "parallel CLI check: ok"
