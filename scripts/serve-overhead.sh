#!/usr/bin/env bash
# The server's overhead over `tessel generate` for the same request: runs the denoising loop once
# through `tessel generate` and once as a video job of `tessel serve` (same model, text input, size,
# frames, steps, guidance, seed and threads), then prints both loop times, the server's whole run
# (loop, decoding, encoding) and the client's time from POST to completed.
#
#   bash scripts/serve-overhead.sh --model DIR (--embeddings FILE | --prompt TEXT) [--size 832x480]
#        [--frames 9] [--steps 4] [--guidance 5] [--seed 42] [--threads N] [--device cpu|cuda] [--bin build/bin]
#        [--port 8199]
#
# Use a model directory without vae/ (or the same decoding on both sides) for a like-for-like loop,
# and enough steps that the first steps' warm-up does not dominate.
set -euo pipefail
bin=build/bin model="" embeddings="" prompt="" size=832x480 frames=9 steps=4 guidance=5 seed=42 threads=0 port=8199 device=cpu
while [[ $# -gt 0 ]]; do
  case "$1" in
    --model) model=$2; shift 2 ;; --embeddings) embeddings=$2; shift 2 ;; --prompt) prompt=$2; shift 2 ;;
    --size) size=$2; shift 2 ;; --frames) frames=$2; shift 2 ;; --steps) steps=$2; shift 2 ;;
    --guidance) guidance=$2; shift 2 ;; --seed) seed=$2; shift 2 ;; --threads) threads=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;; --port) port=$2; shift 2 ;; --device) device=$2; shift 2 ;;
    *) echo "serve-overhead: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ -n "$model" ]] || { echo "serve-overhead: --model DIR is required" >&2; exit 2; }
[[ -n "$embeddings" || -n "$prompt" ]] || { echo "serve-overhead: --embeddings FILE or --prompt TEXT is required" >&2; exit 2; }
work=$(mktemp -d)
trap 'kill "$server" 2>/dev/null || true; rm -rf "$work"' EXIT
text_generate=(--embeddings "$embeddings"); text_serve=(--embeddings "$embeddings")
if [[ -n "$prompt" ]]; then text_generate=(--prompt "$prompt"); text_serve=(); fi
run_args=(--device "$device"); [[ "$threads" != 0 ]] && run_args+=(--threads "$threads")

"$bin/tessel" generate --model "$model" "${text_generate[@]}" --size "$size" --frames "$frames" --steps "$steps" \
  --guidance "$guidance" --seed "$seed" "${run_args[@]}" --out "$work/latents.safetensors" 2> "$work/generate.log" > /dev/null
generate_loop=$(grep -o 'elapsed [0-9.]* s' "$work/generate.log" | tail -1 | awk '{print $2}')

"$bin/tessel" serve --model "$model" "${text_serve[@]}" --port "$port" "${run_args[@]}" > "$work/serve.log" 2>&1 &
server=$!
for _ in $(seq 600); do grep -q "listening on" "$work/serve.log" && break; sleep 0.5; done
url="http://127.0.0.1:$port"
body=$(printf '{"prompt": "%s", "size": "%s", "num_frames": %s, "num_inference_steps": %s, "guidance_scale": %s, "seed": %s}' \
  "${prompt:-same embeddings}" "$size" "$frames" "$steps" "$guidance" "$seed")
start=$(date +%s.%N)
id=$(curl -sf -X POST "$url/v1/videos" -H 'Content-Type: application/json' -d "$body" | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
while :; do  # polled with curl and grep only: a poller must not take CPU from the run it times
  video=$(curl -sf "$url/v1/videos/$id")
  status=$(grep -o '"status":"[a-z_]*"' <<< "$video" | cut -d'"' -f4)
  [[ "$status" == queued || "$status" == in_progress ]] || break
  sleep 0.1
done
end=$(date +%s.%N)
[[ "$status" == completed ]] || { echo "serve-overhead: the video ended $status: $video" >&2; exit 1; }
metrics=$(curl -sf "$url/metrics")
serve_loop=$(awk '/^tessel_step_seconds_sum/ {print $2}' <<< "$metrics")
run_seconds=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["run_seconds"])' "$video")
python3 - "$generate_loop" "$serve_loop" "$run_seconds" "$start" "$end" "$steps" <<'PY'
import sys
generate_loop, serve_loop, run_seconds, start, end, steps = map(float, sys.argv[1:])
client = end - start
print(f"tessel generate: denoising loop {generate_loop:.2f} s ({generate_loop / steps:.3f} s/step; 0.1 s resolution)")
print(f"tessel serve:    denoising loop {serve_loop:.2f} s ({serve_loop / steps:.3f} s/step), whole run {run_seconds:.2f} s, "
      f"client POST -> completed {client:.2f} s")
print(f"server overhead: loop {100 * (serve_loop / generate_loop - 1):+.2f} %, client time over generate's loop "
      f"{100 * (client / generate_loop - 1):+.2f} %")
PY
kill -TERM "$server"; wait "$server" || true
