#!/usr/bin/env bash
# Multi-GPU check of the sequence- and CFG-parallel paths, on one node with 2 or more NVIDIA GPUs:
#   1. correctness on 2 and 4 GPUs: `tessel sp-bench --check` runs every layout of the ranks
#      (Ulysses N, Ring N, USP 2x2; and with --cfg-parallel the two CFG groups of N/2 ranks) in bf16,
#      dense and sparse (random block-sparse, radial, dynamic top-k masks), on an odd sequence with
#      GQA and batch 2 (a padded ring shard's rows are then a strided token range of each buffer), and compares the gathered output with one GPU's and with fp32 attention on the CPU: a
#      layout passes when its error against fp32 is at most 2x one GPU's (bf16 rounding);
#   2. attention scaling: sp-bench at a Wan 14B 720p shape (75,600 tokens, 40 heads of 128) and a
#      1.3B 480p shape (32,760 tokens, 12 heads), dense and block-sparse at density 0.2;
#   2b. the Wan transformer's CUDA forward under every layout: `tessel dit-bench --device cuda --check`
#      (Wan 1.3B, 2 blocks, 17 frames at 240x416: 1,950 tokens) under Ulysses N, Ring N, USP 2xN/2 and
#      CFG-parallel x Ulysses N/2, dense, radial and dynamic top-k (estimated on the device from the
#      gathered q and k): the whole output against one GPU's forward of the same weights, within
#      rel-L2 2e-2 (bf16 GEMMs of other row counts round differently);
#   2c. `tessel serve --device cuda` with a worker group (Ulysses N, Ring N, USP 2 x N/2, CFG-parallel)
#      on the tiny CUDA model: an image request answered, its time against one worker's;
#   2d. `tessel generate --device cuda --cfg-parallel` on 2 GPUs (one guidance branch per GPU) against
#      one GPU's latents on the tiny CUDA model (pass: rel-L2 <= 2e-2, bf16 GEMMs of batch 1 and 2);
#   2e. (--serve-bar) `tessel serve --device cuda` on the Wan 1.3B random model (init-model --preset
#      wan-1.3b, ~14 GB on disk): one 480p 81-frame 50-step video (POST /v1/videos/sync) with one
#      worker and with --ulysses 2, after a 1-step warm-up request each (bar: Ulysses 2 <= 0.65x);
#   2f. Ulysses head groups (--ulysses-head-groups G): `sp-bench --check` at the correctness shape
#      (bf16, batch 2, 16 heads / 8 kv heads, odd length) with every G that divides a rank's heads
#      among 2 and 4 (the pipelined path against one GPU and fp32), then the 14B 720p attention shape
#      (75,600 tokens, 40 heads of 128, dense) under Ulysses N with G = 1, 2 and 4 (5 where 4 does not
#      divide the 40/N heads), G > 1 also with --ulysses-sm-margin 32: step time and the exposed
#      share of the all-to-alls (the waits ctx.stream made for them, sp-bench's comm_ms);
#   2g. the Wan VAE decode split by height over N GPUs (`tessel vae-bench --ulysses N --check`, 480p
#      81 frames, random Wan 2.1 weights, --no-tf32 so the check's bound is 1e-4): its time against one
#      GPU's whole-frame decode, and the video against this rank's own whole-frame decode;
#   3. Wan step times with `tessel dit-bench --device cuda` on 1, 2 and 4 GPUs, 14B 720p 81 frames and
#      1.3B 480p, for each attention of --dit-attn (dense, radial, dynamic_topk: top-k 0.2, every row
#      ranked) under each layout of --dit-layouts (ulysses: Ulysses N; ulysses-g2: Ulysses N with
#      --ulysses-head-groups 2, where 2 divides a rank's heads; ring: Ring N; cfg: CFG-parallel
#      x Ulysses N/2), the memory per GPU (nvidia-smi's peak during the run), the bytes sent, and
#      (N > 1, --check) the last step against one GPU's;
#   4. prints the table last (also written to OUT/table.md).
# Options: --bin DIR (holding `tessel`; default build-cuda/bin), --out DIR (default ./multi-gpu-out),
#          --gpus "2 4" (world sizes to run; those above the visible GPU count are skipped),
#          --launcher mpirun|env (default: mpirun when on PATH, else one process per GPU started
#          here with TESSEL_RANK / TESSEL_WORLD_SIZE and a TCP rendezvous),
#          --skip-correctness (1, 2b and 2c), --skip-attention, --skip-dit, --skip-head-groups (2f), --skip-vae (2g), --steps N (timed steps, default 3),
#          --dit-models "wan-14b wan-1.3b" (the models of 3), --dit-attn "dense radial" (its attentions),
#          --dit-layouts "ulysses" (its layouts: ulysses ring cfg), --serve-bar (2e), --skip-sp-check (1 alone), --skip-dit-check (2b alone),
#          --run-timeout S (each multi-rank run is stopped after S seconds, default 300: a hang fails
#          its row instead of the whole check).
# Exit status: 1 when any correctness case fails (a mismatch, or a run that did not finish).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="$ROOT/build-cuda/bin" OUTDIR="$PWD/multi-gpu-out" GPUS="2 4" LAUNCHER="" STEPS=3
RUN_CORRECTNESS=1 RUN_ATTENTION=1 RUN_DIT=1 RUN_HEAD_GROUPS=1 RUN_VAE=1 RUN_SP_CHECK=1 RUN_DIT_CHECK=1 DIT_MODELS="wan-14b wan-1.3b" RUN_TIMEOUT=300
DIT_ATTN="dense radial" DIT_LAYOUTS="ulysses" RUN_SERVE_BAR=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bin) BIN="$2"; shift 2 ;;
    --out) OUTDIR="$2"; shift 2 ;;
    --gpus) GPUS="$2"; shift 2 ;;
    --launcher) LAUNCHER="$2"; shift 2 ;;
    --steps) STEPS="$2"; shift 2 ;;
    --dit-models) DIT_MODELS="$2"; shift 2 ;;
    --dit-attn) DIT_ATTN="$2"; shift 2 ;;
    --dit-layouts) DIT_LAYOUTS="$2"; shift 2 ;;
    --serve-bar) RUN_SERVE_BAR=1; shift ;;
    --skip-sp-check) RUN_SP_CHECK=0; shift ;;
    --skip-dit-check) RUN_DIT_CHECK=0; shift ;;
    --run-timeout) RUN_TIMEOUT="$2"; shift 2 ;;
    --skip-correctness) RUN_CORRECTNESS=0; shift ;;
    --skip-attention) RUN_ATTENTION=0; shift ;;
    --skip-dit) RUN_DIT=0; shift ;;
    --skip-head-groups) RUN_HEAD_GROUPS=0; shift ;;
    --skip-vae) RUN_VAE=0; shift ;;
    *) echo "multi-gpu-check: unknown option $1" >&2; exit 2 ;;
  esac
done
TESSEL="$BIN/tessel"
[[ -x "$TESSEL" ]] || { echo "multi-gpu-check: no tessel binary at $TESSEL (--bin DIR)" >&2; exit 2; }
command -v nvidia-smi >/dev/null || { echo "multi-gpu-check: no nvidia-smi: this needs NVIDIA GPUs" >&2; exit 2; }
VISIBLE="$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)"
GPU_NAME="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
if [[ -z "$LAUNCHER" ]]; then
  if command -v mpirun >/dev/null; then LAUNCHER="mpirun"; else LAUNCHER="env"; fi
fi
mkdir -p "$OUTDIR"
# NVLink multicast (NVLS) stays off: the lent machines do not support it reliably.
export NCCL_NVLS_ENABLE=0
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"
echo "multi-gpu-check: $VISIBLE x $GPU_NAME, launcher $LAUNCHER, tessel $TESSEL, logs in $OUTDIR"

PORT=29511
# launch N LOG cmd...: runs cmd on N ranks (one GPU each); rank 0's output goes to LOG, every rank's
# to LOG.rankR. Returns non-zero when any rank failed.
launch() {
  local n="$1" log="$2"; shift 2
  if [[ "$n" -eq 1 ]]; then timeout "$RUN_TIMEOUT" "$@" >"$log" 2>&1; return $?; fi
  if [[ "$LAUNCHER" == mpirun ]]; then
    timeout "$RUN_TIMEOUT" mpirun -n "$n" --oversubscribe --allow-run-as-root --output-filename "$log.ranks" -x NCCL_NVLS_ENABLE -x OMP_NUM_THREADS \
      "$@" >"$log" 2>&1
    return $?
  fi
  PORT=$((PORT + 1))
  local pids=() status=0 r
  for ((r = 0; r < n; r++)); do
    TESSEL_RANK=$r TESSEL_WORLD_SIZE=$n TESSEL_LOCAL_RANK=$r TESSEL_MASTER_ADDR=127.0.0.1 TESSEL_MASTER_PORT=$PORT \
      timeout "$RUN_TIMEOUT" "$@" >"$log.rank$r" 2>&1 &
    pids+=($!)
  done
  for r in "${!pids[@]}"; do wait "${pids[$r]}" || status=1; done
  cp "$log.rank0" "$log"
  return $status
}

# json_rows LOG sp|dit: '|'-separated fields from the JSON line a command printed (python3 reads it).
json_rows() { python3 - "$@" <<'EOF'
import json, sys
path, kind = sys.argv[1], sys.argv[2]
try:
    report = json.loads([line for line in open(path) if line.startswith("{")][-1])
except Exception:
    sys.exit(0)
if kind == "sp":
    for row in report["layouts"]:
        layout = f"U{row['ulysses']} x R{row['ring']} x C{row['cfg']}"
        extra = ""
        if "pass" in row:
            extra = f"{row['rel_l2_vs_fp32']:.2e} (1 GPU {row['one_rank_rel_l2_vs_fp32']:.2e}) {'ok' if row['pass'] else 'FAIL'}"
        if row.get("ulysses_head_groups", 1) > 1:
            layout += f" (head groups {row['ulysses_head_groups']})"
        comm = f"{row['comm_ms']:.3f} ({100 * row['comm_share']:.1f} %)" if row.get("comm_ms") is not None else ""
        print(f"{layout}|{row['step_ms']:.3f}|{row['one_rank_ms']:.3f}|{row['speedup']:.2f}|{row['sent_mb']:.1f}|{extra}|{comm}")
else:
    check = ""
    if "check_pass" in report:
        check = f"{report['rel_l2_vs_one_process']:.2e} {'ok' if report['check_pass'] else 'FAIL'}"
    comm = report.get("comm_s_per_step")
    share = f"{comm:.3f} s ({100 * comm / report['step_s_median']:.1f} %)" if comm is not None and report["step_s_median"] > 0 else ""
    print(f"{report['step_s_median']:.3f}|{report['self_attention_density']:.3f}|{report.get('sent_mb_per_step', 0):.0f}|{check}|{share}")
EOF
}

TABLE="$OUTDIR/table.md"
CORRECTNESS_ROWS=() DIT_CHECK_ROWS=() ATTENTION_ROWS=() DIT_ROWS=() HEAD_GROUP_ROWS=() VAE_ROWS=()
FAILED=0
MASKS=("dense" "block_sparse" "radial" "dynamic_topk")
mask_flags() {  # the sp-bench flags of a mask kind at the correctness shape (odd length, GQA)
  case "$1" in
    radial) echo "--mask radial --grid 7x17x33" ;;            # 3927 tokens
    dense) echo "--mask dense --seq 4093" ;;
    *) echo "--mask $1 --density 0.2 --seq 4093" ;;
  esac
}

# ---- 1. correctness -----------------------------------------------------------------------------
if [[ $RUN_CORRECTNESS -eq 1 && $RUN_SP_CHECK -eq 1 ]]; then
  for n in $GPUS; do
    [[ "$n" -le "$VISIBLE" ]] || { echo "skipping $n GPUs: $VISIBLE visible"; continue; }
    for mask in "${MASKS[@]}"; do
      for cfg in "" "--cfg-parallel"; do
        name="check-n$n-$mask${cfg:+-cfg}"
        echo "== $name"
        # shellcheck disable=SC2046
        if ! launch "$n" "$OUTDIR/$name.log" "$TESSEL" sp-bench --device cuda --dtype bf16 --batch 2 --heads 8 --kv-heads 4 --head-dim 128 \
             $(mask_flags "$mask") --steps 1 --warmup 0 --check --json $cfg; then
          FAILED=1
          CORRECTNESS_ROWS+=("| $n | $mask | ${cfg:+cfg-parallel} | run failed (see $name.log) | | | | | |")
          continue
        fi
        while IFS='|' read -r layout step one speedup sent check _comm; do
          [[ "$check" == *FAIL* ]] && FAILED=1
          CORRECTNESS_ROWS+=("| $n | $mask | $layout | $check |")
        done < <(json_rows "$OUTDIR/$name.log" sp)
      done
    done
  done
fi

# ---- 2b. the Wan forward under every layout ----------------------------------------------------------
if [[ $RUN_CORRECTNESS -eq 1 && $RUN_DIT_CHECK -eq 1 ]]; then
  for n in $GPUS; do
    [[ "$n" -le "$VISIBLE" ]] || continue
    layouts=("--ulysses $n" "--ring $n")
    [[ "$n" -ge 4 ]] && layouts+=("--ulysses 2 --ring $((n / 2))")
    layouts+=("--cfg-parallel --ulysses $((n / 2))")
    for layout in "${layouts[@]}"; do
      for attn in dense radial dynamic_topk; do
        sparse_flags=()
        [[ "$attn" == radial ]] && sparse_flags=(--sparse-attn-backend radial --sparse-attn-pattern radial)
        # Estimated on the device from the gathered q and k, then cut per rank.
        [[ "$attn" == dynamic_topk ]] && sparse_flags=(--sparse-attn-backend dynamic_topk --sparse-attn-pattern dynamic_topk
                                                     --sparse-attn-topk 0.3)
        name="dit-check-n$n-${layout// /}-$attn"
        echo "== $name"
        # shellcheck disable=SC2086
        if ! launch "$n" "$OUTDIR/$name.log" "$TESSEL" dit-bench --device cuda --model wan-1.3b --layers 2 --frames 17 --height 240 \
             --width 416 --batch 2 --steps 1 --warmup 0 --check --json "${sparse_flags[@]}" $layout; then
          FAILED=1
          DIT_CHECK_ROWS+=("| $n | $layout | $attn | run failed or FAIL (see $name.log) |")
          continue
        fi
        IFS='|' read -r step density sent check share < <(json_rows "$OUTDIR/$name.log" dit)
        [[ "$check" == *ok* ]] || FAILED=1
        DIT_CHECK_ROWS+=("| $n | $layout | $attn | $check |")
      done
    done
  done
fi

# ---- 2c. the server's worker group on GPUs ----------------------------------------------------------
SERVE_ROWS=()
# timed_serve NAME WAIT_S PATH BODY FLAGS...: start `tessel serve FLAGS`, POST BODY (JSON) to PATH twice
# (the first warms the workers: kernels, cuBLASLt heuristics; "steps" in BODY is set to 1 for it),
# time the second, stop the server; prints "status seconds". WAIT_S bounds the start-up.
timed_serve() {
  local name="$1" wait_s="$2" path="$3" body="$4"; shift 4
  "$TESSEL" serve --device cuda --port 0 "$@" >"$OUTDIR/$name.log" 2>&1 &
  local server=$! port=""
  for _ in $(seq 1 $((wait_s * 10))); do
    port="$(sed -n 's/.*listening on http:\/\/[^:]*:\([0-9]*\).*/\1/p' "$OUTDIR/$name.log" | head -1)"
    [[ -n "$port" ]] && break
    kill -0 "$server" 2>/dev/null || break
    sleep 0.1
  done
  if [[ -z "$port" ]]; then echo "no-server 0"; kill "$server" 2>/dev/null; wait "$server" 2>/dev/null; return; fi
  python3 - "$port" "$path" "$body" <<'PYEOF'
import json, sys, time, urllib.request
port, path, body = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
def post(fields):
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method="POST", data=json.dumps(fields).encode(),
                                     headers={"Content-Type": "application/json"})
    start = time.time()
    try:
        with urllib.request.urlopen(request, timeout=900) as response:
            response.read()
            return response.status, time.time() - start
    except urllib.error.HTTPError as e:
        return e.code, time.time() - start
post(dict(body, num_inference_steps=1))
status, seconds = post(body)
print(status, f"{seconds:.3f}")
PYEOF
  kill -TERM "$server" 2>/dev/null; wait "$server" 2>/dev/null
}
serve_once() {  # serve_once NAME FLAGS...: one image request of the tiny CUDA model; prints "status seconds"
  local name="$1"; shift
  timed_serve "$name" 60 /v1/images/generations '{"prompt": "a red cube", "seed": 3, "num_inference_steps": 4}' \
    --model "$OUTDIR/tiny-cuda-model" --size 64x64 --frames 5 --steps 4 "$@"
}
if [[ $RUN_CORRECTNESS -eq 1 ]]; then
  "$TESSEL" init-model --preset tiny-cuda --out "$OUTDIR/tiny-cuda-model" >/dev/null 2>&1
  read -r status one_s < <(serve_once serve-n1)
  SERVE_ROWS+=("| 1 | one worker | $status | $one_s |")
  for n in $GPUS; do
    [[ "$n" -le "$VISIBLE" ]] || continue
    # The tiny model has 2 heads: Ulysses degree 2 at most (a larger one is refused at start-up).
    layouts=("--ring $n" "--cfg-parallel --ulysses $((n / 2 < 2 ? n / 2 : 2)) --ring $((n / 2 > 2 ? n / 4 : 1))")
    if [[ "$n" -ge 4 ]]; then layouts+=("--ulysses 2 --ring $((n / 2))"); else layouts=("--ulysses $n" "${layouts[@]}"); fi
    for layout in "${layouts[@]}"; do
      # shellcheck disable=SC2086
      read -r status seconds < <(serve_once "serve-n$n-${layout// /}" $layout)
      [[ "$status" == 200 ]] || FAILED=1
      SERVE_ROWS+=("| $n | $layout | $status | $seconds |")
    done
  done
fi

# ---- 2d. CFG-parallel in the CUDA pipeline ------------------------------------------------------------
CFG_ROWS=()
if [[ $RUN_CORRECTNESS -eq 1 && "$VISIBLE" -ge 2 ]]; then
  gen=(generate --model "$OUTDIR/tiny-cuda-model" --device cuda --prompt "a red cube" --size 64x64 --frames 5 --steps 4 --seed 1 --guidance 5)
  "$TESSEL" "${gen[@]}" --out "$OUTDIR/cfg-one.safetensors" >"$OUTDIR/cfg-one.log" 2>&1
  if launch 2 "$OUTDIR/cfg-two.log" "$TESSEL" "${gen[@]}" --cfg-parallel --out "$OUTDIR/cfg-two.safetensors"; then
    check="$(python3 - "$OUTDIR/cfg-one.safetensors" "$OUTDIR/cfg-two.safetensors" <<'PYEOF'
import json, struct, sys
import numpy as np
def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        name, entry = next((k, v) for k, v in header.items() if k != "__metadata__")
        f.seek(8 + n + entry["data_offsets"][0])
        return np.frombuffer(f.read(entry["data_offsets"][1] - entry["data_offsets"][0]), dtype=np.float32).astype(np.float64)
a, b = load(sys.argv[1]), load(sys.argv[2])
error = np.linalg.norm(a - b) / np.linalg.norm(a)
print(f"{error:.2e} {'ok' if np.isfinite(b).all() and error <= 2e-2 else 'FAIL'}")
PYEOF
)"
    [[ "$check" == *ok* ]] || FAILED=1
    CFG_ROWS+=("| 2 | generate --cfg-parallel (tiny CUDA model, 4 steps) | $check |")
  else
    FAILED=1
    CFG_ROWS+=("| 2 | generate --cfg-parallel | run failed (see cfg-two.log) |")
  fi
fi

# ---- 2e. the server at a real shape: Wan 1.3B 480p 81 frames, 50 steps, one worker against Ulysses 2 ----------
SERVE_BAR_ROWS=()
if [[ $RUN_SERVE_BAR -eq 1 && "$VISIBLE" -ge 2 ]]; then
  [[ -f "$OUTDIR/wan-1.3b-model/model_index.json" ]] ||
    "$TESSEL" init-model --preset wan-1.3b --out "$OUTDIR/wan-1.3b-model" >"$OUTDIR/init-wan-1.3b.log" 2>&1
  video='{"prompt": "a red cube on a table", "seed": 5, "size": "832x480", "num_frames": 81, "num_inference_steps": 50}'
  one_s=""
  for layout in "" "--ulysses 2"; do
    # shellcheck disable=SC2086
    read -r status seconds < <(timed_serve "serve-bar${layout:+-${layout//[ -]/}}" 600 /v1/videos/sync "$video" \
      --model "$OUTDIR/wan-1.3b-model" --size 832x480 --frames 81 --steps 50 $layout)
    [[ "$status" == 200 ]] || FAILED=1
    ratio=""
    if [[ -z "$layout" ]]; then one_s="$seconds"; elif [[ -n "$one_s" && "$status" == 200 ]]; then
      ratio="$(python3 -c "r = $seconds / $one_s; print(f'{r:.2f}x one worker ({\"met\" if r <= 0.65 else \"NOT met\"}: bar 0.65x)')")"
    fi
    SERVE_BAR_ROWS+=("| ${layout:-one worker} | $status | $seconds | $ratio |")
  done
fi

# ---- 2. attention scaling -------------------------------------------------------------------------
if [[ $RUN_ATTENTION -eq 1 ]]; then
  for shape in "14b-720p|--seq 75600 --heads 40 --head-dim 128" "1.3b-480p|--seq 32760 --heads 12 --head-dim 128"; do
    label="${shape%%|*}" flags="${shape#*|}"
    for mask in dense block_sparse; do
      for n in $GPUS; do
        [[ "$n" -le "$VISIBLE" ]] || continue
        name="attention-$label-$mask-n$n"
        echo "== $name"
        # shellcheck disable=SC2086
        if ! launch "$n" "$OUTDIR/$name.log" "$TESSEL" sp-bench --device cuda --dtype bf16 $flags --mask "$mask" --density 0.2 \
             --steps "$STEPS" --warmup 1 --json; then
          ATTENTION_ROWS+=("| $label | $mask | $n | run failed (see $name.log) | | | | |")
          continue
        fi
        while IFS='|' read -r layout step one speedup sent check _comm; do
          ATTENTION_ROWS+=("| $label | $mask | $n | $layout | $one | $step | $speedup | $(python3 -c "print(f'{$speedup / $n:.2f}')") | $sent |")
        done < <(json_rows "$OUTDIR/$name.log" sp)
      done
    done
  done
fi

# ---- 2f. Ulysses head groups ------------------------------------------------------------------------
if [[ $RUN_HEAD_GROUPS -eq 1 ]]; then
  for n in $GPUS; do
    [[ "$n" -le "$VISIBLE" ]] || continue
    for groups in 2 4; do  # the correctness shape: 16 heads / 8 kv heads, 16/N and 8/N of them per rank
      (( (8 / n) % groups == 0 && 8 % n == 0 )) || continue
      name="head-groups-check-n$n-g$groups"
      echo "== $name"
      if ! launch "$n" "$OUTDIR/$name.log" "$TESSEL" sp-bench --device cuda --dtype bf16 --batch 2 --heads 16 --kv-heads 8 \
           --head-dim 128 --mask dense --seq 4093 --ulysses "$n" --ulysses-head-groups "$groups" --steps 1 --warmup 0 --check --json; then
        FAILED=1
        HEAD_GROUP_ROWS+=("| check 4093 tokens | $n | $groups | run failed or FAIL (see $name.log) | | |")
        continue
      fi
      while IFS='|' read -r layout step one speedup sent check comm; do
        [[ "$check" == *ok* ]] || FAILED=1
        HEAD_GROUP_ROWS+=("| check 4093 tokens | $n | $groups | $check | | |")
      done < <(json_rows "$OUTDIR/$name.log" sp)
    done
    # 14B 720p: 40 heads, 40/N per rank; G > 1 also with 32 multiprocessors left to the exchanges
    for run in 1:0 2:0 2:32 4:0 4:32 5:0 5:32; do
      groups="${run%%:*}" margin="${run#*:}"
      (( (40 / n) % groups == 0 )) || continue
      [[ "$groups" -eq 5 && $(( (40 / n) % 4 )) -eq 0 ]] && continue
      name="head-groups-14b-720p-n$n-g$groups-m$margin"
      echo "== $name"
      margin_flags=()
      [[ "$margin" -gt 0 ]] && margin_flags=(--ulysses-sm-margin "$margin")
      if ! launch "$n" "$OUTDIR/$name.log" "$TESSEL" sp-bench --device cuda --dtype bf16 --seq 75600 --heads 40 --head-dim 128 \
           --mask dense --ulysses "$n" --ulysses-head-groups "$groups" "${margin_flags[@]}" --steps "$STEPS" --warmup 1 --json; then
        HEAD_GROUP_ROWS+=("| 14b-720p dense | $n | $groups (sm margin $margin) | run failed (see $name.log) | | |")
        continue
      fi
      while IFS='|' read -r layout step one speedup sent check comm; do
        HEAD_GROUP_ROWS+=("| 14b-720p dense | $n | $groups (sm margin $margin) | $step ms (one GPU $one ms, ${speedup}x) | $comm | $sent |")
      done < <(json_rows "$OUTDIR/$name.log" sp)
    done
  done
fi

# ---- 2g. the VAE decode split by height -----------------------------------------------------------
if [[ $RUN_VAE -eq 1 ]]; then
  VAE_ARGS=(vae-bench --device cuda --frames 81 --height 480 --width 832 --iters 3 --warmup 1 --no-tf32 --json)
  vae_field() { python3 -c 'import json,sys; r=json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1]); print(r.get(sys.argv[2], ""))' "$1" "$2" 2>/dev/null; }
  echo "== vae-decode-n1"
  if launch 1 "$OUTDIR/vae-decode-n1.log" "$TESSEL" "${VAE_ARGS[@]}"; then VAE_ONE="$(vae_field "$OUTDIR/vae-decode-n1.log" median_s)"; else VAE_ONE=""; fi
  for n in $GPUS; do
    [[ "$n" -le "$VISIBLE" ]] || continue
    name="vae-decode-n$n"
    echo "== $name"
    if ! launch "$n" "$OUTDIR/$name.log" "$TESSEL" "${VAE_ARGS[@]}" --ulysses "$n" --check; then
      FAILED=1
      VAE_ROWS+=("| $n | run failed or check FAIL (see $name.log) | $VAE_ONE | | |")
      continue
    fi
    split="$(vae_field "$OUTDIR/$name.log" median_s)" error="$(vae_field "$OUTDIR/$name.log" rel_l2_vs_one_rank)"
    speedup="$(python3 -c "print(f'{float(\"$VAE_ONE\") / float(\"$split\"):.2f}')" 2>/dev/null)"
    VAE_ROWS+=("| $n | $split | $VAE_ONE | $speedup | $error |")
  done
fi

# ---- 3. Wan step times ------------------------------------------------------------------------------
# Peak memory per GPU: nvidia-smi sampled every second during each run (MiB, the largest GPU).
peak_memory_file="$OUTDIR/memory.samples"
if [[ $RUN_DIT -eq 1 ]]; then
  if ! "$TESSEL" dit-bench --help 2>/dev/null | grep -q -- "--device"; then
    DIT_ROWS+=("| all | | | | | this tessel's dit-bench has no --device (no CUDA Wan path): not run | | | | |")
  else
    for model in "wan-14b|--frames 81 --height 720 --width 1280" "wan-1.3b|--frames 81 --height 480 --width 832"; do
      name_model="${model%%|*}" size="${model#*|}"
      [[ " $DIT_MODELS " == *" $name_model "* ]] || continue
      for attn in $DIT_ATTN; do
        sparse_flags=()
        [[ "$attn" == radial ]] && sparse_flags=(--sparse-attn-backend radial --sparse-attn-pattern radial)
        # Random weights make blocks whose tokens are not alike: rank every block (no similarity guard).
        [[ "$attn" == dynamic_topk ]] && sparse_flags=(--sparse-attn-config
          '{"backend": "dynamic_topk", "pattern": {"type": "dynamic_topk"}, "selection": {"topk_ratio": 0.2}, "options": {"similarity_threshold": "-2"}}')
        base_s=""
        runs=("1|")
        for n in $GPUS; do
          for layout in $DIT_LAYOUTS; do
            case "$layout" in
              ulysses) runs+=("$n|--ulysses $n") ;;
              ulysses-g2)  # the pipelined all-to-alls, where 2 divides a rank's heads (14B: 40, 1.3B: 12)
                heads=$([[ "$name_model" == wan-14b ]] && echo 40 || echo 12)
                (( (heads / n) % 2 == 0 )) && runs+=("$n|--ulysses $n --ulysses-head-groups 2") ;;
              ring) runs+=("$n|--ring $n") ;;
              cfg) runs+=("$n|--cfg-parallel$([[ $n -gt 2 ]] && echo " --ulysses $((n / 2))")") ;;
              *) echo "multi-gpu-check: unknown --dit-layouts entry $layout" >&2; exit 2 ;;
            esac
          done
        done
        for run in "${runs[@]}"; do
          n="${run%%|*}" layout="${run#*|}"
          [[ "$n" -le "$VISIBLE" ]] || continue
          parallel_flags=()
          # shellcheck disable=SC2206
          [[ "$n" -gt 1 ]] && parallel_flags=($layout --check)
          name="dit-$name_model-$attn-n$n${layout:+-${layout//[ -]/}}"
          echo "== $name"
          (while true; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits >>"$peak_memory_file"; sleep 1; done) &
          sampler=$!
          : >"$peak_memory_file"
          # shellcheck disable=SC2086
          launch "$n" "$OUTDIR/$name.log" "$TESSEL" dit-bench --device cuda --model "$name_model" $size --batch 2 \
            --steps "$STEPS" --warmup 1 --json "${sparse_flags[@]}" "${parallel_flags[@]}"
          status=$?
          kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null
          peak="$(sort -n "$peak_memory_file" | tail -1)"
          if [[ $status -ne 0 ]]; then
            DIT_ROWS+=("| $name_model | $attn | $n | $layout | run failed or FAIL (see $name.log) | | | | | |")
            continue
          fi
          IFS='|' read -r step density sent check share < <(json_rows "$OUTDIR/$name.log" dit)
          [[ "$n" -eq 1 ]] && base_s="$step"
          efficiency=""
          [[ -n "$base_s" && -n "$step" ]] && efficiency="$(python3 -c "print(f'{$base_s / $step:.2f}x, {$base_s / $step / $n:.2f}')")"
          DIT_ROWS+=("| $name_model | $attn (density $density) | $n | ${layout:-one GPU} | $step | $efficiency | ${peak:-?} MiB | $sent | ${share:-} | $check |")
        done
      done
    done
  fi
fi

# ---- 4. the table --------------------------------------------------------------------------------
{
  echo "## Multi-GPU check: $VISIBLE x $GPU_NAME ($(date -u +%Y-%m-%d), launcher $LAUNCHER)"
  echo
  echo "Correctness (bf16, B=1, 8 heads / 4 kv heads of 128, odd sequence; pass: error vs fp32 <= 2x one GPU's)"
  echo
  echo "| GPUs | mask | layout | rel-L2 vs fp32 (one GPU) |"
  echo "|---|---|---|---|"
  printf '%s\n' "${CORRECTNESS_ROWS[@]}"
  echo
  echo "Wan transformer forward under each layout (dit-bench --check: rel-L2 of the whole output vs one GPU, pass <= 2e-2)"
  echo
  echo "| GPUs | layout | attention | rel-L2 vs one GPU |"
  echo "|---|---|---|---|"
  printf '%s\n' "${DIT_CHECK_ROWS[@]}"
  echo
  echo "tessel serve --device cuda with a worker group (tiny CUDA model, 64x64, 4 steps, guidance 5): one image request after a warm-up one"
  echo
  echo "| GPUs | layout | HTTP status | seconds |"
  echo "|---|---|---|---|"
  printf '%s\n' "${SERVE_ROWS[@]}"
  echo
  if [[ ${#SERVE_BAR_ROWS[@]} -gt 0 ]]; then
    echo "tessel serve --device cuda, Wan 1.3B random weights: one 480p 81-frame 50-step video (POST /v1/videos/sync, after a 1-step warm-up)"
    echo
    echo "| workers | HTTP status | seconds | against one worker |"
    echo "|---|---|---|---|"
    printf '%s\n' "${SERVE_BAR_ROWS[@]}"
    echo
  fi
  echo "CFG-parallel in the CUDA pipeline: the latents against one GPU's (rel-L2, pass <= 2e-2)"
  echo
  echo "| GPUs | run | rel-L2 vs one GPU |"
  echo "|---|---|---|"
  printf '%s\n' "${CFG_ROWS[@]}"
  echo
  echo "Attention (bf16; block_sparse at density 0.2): median step over $STEPS"
  echo
  echo "| shape | mask | GPUs | layout | 1 GPU ms | N GPUs ms | speedup | efficiency | MB sent per rank |"
  echo "|---|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${ATTENTION_ROWS[@]}"
  echo
  echo "Ulysses head groups (sp-bench, bf16, --ulysses N --ulysses-head-groups G): the check against one GPU and fp32, and the"
  echo "14B 720p attention (75,600 tokens, 40 heads of 128, dense, batch 1); exposed all-to-all: the waits for the exchanges"
  echo
  echo "| case | GPUs | head groups | step (or check) | exposed all-to-all ms (share) | MB sent per rank |"
  echo "|---|---|---|---|---|---|"
  printf '%s\n' "${HEAD_GROUP_ROWS[@]}"
  echo
  echo "Wan VAE decode split by height (vae-bench, 480p 81 frames, fp32 without TF32, random Wan 2.1 weights; median of 3)"
  echo
  echo "| GPUs | split decode s | one GPU s | speedup | rel-L2 vs the rank's whole-frame decode |"
  echo "|---|---|---|---|---|"
  printf '%s\n' "${VAE_ROWS[@]}"
  echo
  echo "Wan denoising step (dit-bench, batch 2, random weights)"
  echo
  echo "| model | attention | GPUs | layout | step s | speedup, efficiency | peak memory per GPU | MB sent per step (rank 0) | attention exchanges per step (share) | vs one GPU |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${DIT_ROWS[@]}"
} | tee "$TABLE"
[[ $FAILED -eq 0 ]] || echo "multi-gpu-check: correctness FAILED (see the table and the logs)"
exit $FAILED
