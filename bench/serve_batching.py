#!/usr/bin/env python3
"""The serving issue's bars for continuous batching, against a running model on one GPU.

Starts `tessel serve` on a model directory (the 1.3B random model of `init-model --preset
wan-1.3b` in docs/benchmarks.md) and measures, through the HTTP API only:

  images   8 image requests (832x480, 20 steps) one after another, then the same 8 at once:
           the time until the last answer, and the speedup (bar: >= 1.5x);
  videos   4 video requests (17 frames) one after another, then at once (bar: >= 1.0x);
  hol      head-of-line: an image request sent while a 50-step video runs (after its 3rd step):
           the image's latency, and the video's step when the image arrived and when it finished;
  mixed    100 requests (75 images, 25 videos, shuffled with a fixed seed) from 16 clients at once:
           answers by status, lost requests, p50/p99 latency per kind, and the server's
           `tessel_requests_total` against what the clients saw (no double answer);
  equality each batched image's PNG against the same seed served alone (bytes, and the largest
           pixel difference when Pillow and numpy import).

Only the standard library is needed. Prints a table last and writes JSON with --json-out.

  python3 bench/serve_batching.py --tessel build/bin/tessel --model DIR [--device cuda]
          [--port 8311] [--cases images,videos,hol,mixed] [--steps 20] [--json-out FILE]
"""
from __future__ import annotations

import argparse
import base64
import io
import json
import random
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

CASES = ("images", "videos", "hol", "mixed")


def post(url: str, body: dict, timeout: float = 3600.0) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=60) as response:
        return json.loads(response.read())


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = q / 100.0 * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


class Server:
    def __init__(self, args: argparse.Namespace, log_path: str):
        self.url = f"http://127.0.0.1:{args.port}"
        command = [args.tessel, "serve", "--model", args.model, "--port", str(args.port), "--device", args.device,
                   "--max-batch", str(args.max_batch), "--max-queue", "128", "--steps", str(args.steps), "--size", args.size,
                   "--image-timeout", "3600"] + args.serve_args
        print("+", " ".join(command), flush=True)
        self.log = open(log_path, "w")
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + args.start_timeout
        while time.time() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"serve_batching: the server exited with {self.process.returncode}; see {log_path}")
            try:
                if get_json(self.url + "/health").get("status") == "ok":
                    return
            except (urllib.error.URLError, ConnectionError, json.JSONDecodeError):
                pass
            time.sleep(0.5)
        raise SystemExit(f"serve_batching: the server did not become healthy in {args.start_timeout} s; see {log_path}")

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(self.url + "/metrics", timeout=60) as response:
            text = response.read().decode()
        values = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                try:
                    values[name] = float(value)
                except ValueError:
                    pass
        return values

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=90)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


def image_body(seed: int, steps: int, size: str) -> dict:
    return {"prompt": f"a lighthouse in a storm, seed {seed}", "size": size, "num_inference_steps": steps, "seed": seed,
            "response_format": "b64_json"}


def video_body(seed: int, steps: int, size: str, frames: int) -> dict:
    return {"prompt": f"waves on rocks, seed {seed}", "size": size, "num_inference_steps": steps, "seed": seed,
            "num_frames": frames}


def run_image(server: Server, seed: int, steps: int, size: str) -> tuple[int, float, bytes]:
    start = time.perf_counter()
    status, payload = post(server.url + "/v1/images/generations", image_body(seed, steps, size))
    elapsed = time.perf_counter() - start
    png = base64.b64decode(json.loads(payload)["data"][0]["b64_json"]) if status == 200 else payload
    return status, elapsed, png


def run_video_sync(server: Server, seed: int, steps: int, size: str, frames: int) -> tuple[int, float, bytes]:
    start = time.perf_counter()
    status, payload = post(server.url + "/v1/videos/sync", video_body(seed, steps, size, frames))
    return status, time.perf_counter() - start, payload


def at_once(jobs: list) -> tuple[float, list]:
    """Runs each job (a callable) on its own thread; returns the time until the last ends and the results."""
    results: list = [None] * len(jobs)

    def run(i: int) -> None:
        try:
            results[i] = jobs[i]()
        except Exception as error:  # a lost request is counted, not raised
            results[i] = error

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - start, results


def largest_pixel_difference(a: bytes, b: bytes) -> float | None:
    try:
        import numpy
        from PIL import Image
    except ImportError:
        return None
    x = numpy.asarray(Image.open(io.BytesIO(a)).convert("RGB"), dtype=numpy.int16)
    y = numpy.asarray(Image.open(io.BytesIO(b)).convert("RGB"), dtype=numpy.int16)
    return float(numpy.abs(x - y).max())


def case_images(server: Server, args: argparse.Namespace, report: dict) -> None:
    n = 8
    seeds = [100 + i for i in range(n)]
    run_image(server, 1, args.steps, args.size)  # warm-up: one alone, then one batch of n
    at_once([lambda s=s: run_image(server, s, args.steps, args.size) for s in seeds])
    alone, start = [], time.perf_counter()
    for seed in seeds:
        alone.append(run_image(server, seed, args.steps, args.size))
    sequential = time.perf_counter() - start
    concurrent, batched = at_once([lambda s=s: run_image(server, s, args.steps, args.size) for s in seeds])
    equal = sum(1 for a, b in zip(alone, batched) if not isinstance(b, Exception) and a[2] == b[2])
    differences = [largest_pixel_difference(a[2], b[2]) for a, b in zip(alone, batched)
                   if not isinstance(b, Exception) and a[0] == 200 and b[0] == 200]
    report["images"] = {"n": n, "size": args.size, "steps": args.steps, "sequential_s": sequential, "concurrent_s": concurrent,
                        "speedup": sequential / concurrent, "alone_s": [a[1] for a in alone],
                        "statuses": sorted({a[0] for a in alone} | {b[0] for b in batched if not isinstance(b, Exception)}),
                        "png_bit_equal": equal,
                        "largest_pixel_difference": max((d for d in differences if d is not None), default=None)}
    print(f"images: {n} one after another {sequential:.2f} s, at once {concurrent:.2f} s: {sequential / concurrent:.2f}x; "
          f"{equal}/{n} PNGs bit-equal to alone", flush=True)


def case_videos(server: Server, args: argparse.Namespace, report: dict) -> None:
    n = 4
    seeds = [200 + i for i in range(n)]
    run_video_sync(server, 2, args.steps, args.size, args.video_frames)  # warm-up
    alone, start = [], time.perf_counter()
    for seed in seeds:
        alone.append(run_video_sync(server, seed, args.steps, args.size, args.video_frames))
    sequential = time.perf_counter() - start
    concurrent, batched = at_once([lambda s=s: run_video_sync(server, s, args.steps, args.size, args.video_frames) for s in seeds])
    equal = sum(1 for a, b in zip(alone, batched) if not isinstance(b, Exception) and a[2] == b[2])
    report["videos"] = {"n": n, "frames": args.video_frames, "size": args.size, "steps": args.steps, "sequential_s": sequential,
                        "concurrent_s": concurrent, "speedup": sequential / concurrent, "bit_equal": equal,
                        "statuses": sorted({a[0] for a in alone} | {b[0] for b in batched if not isinstance(b, Exception)})}
    print(f"videos: {n} x {args.video_frames} frames one after another {sequential:.2f} s, at once {concurrent:.2f} s: "
          f"{sequential / concurrent:.2f}x; {equal}/{n} bit-equal to alone", flush=True)


def case_hol(server: Server, args: argparse.Namespace, report: dict) -> None:
    video_steps = 50
    start = time.perf_counter()
    status, payload = post(server.url + "/v1/videos", video_body(7, video_steps, args.size, args.hol_frames))
    if status != 200:
        raise SystemExit(f"serve_batching: hol video refused {status}: {payload[:300]!r}")
    video_id = json.loads(payload)["id"]
    while get_json(f"{server.url}/v1/videos/{video_id}").get("step", 0) < 3:
        time.sleep(0.05)
    step_at_send = get_json(f"{server.url}/v1/videos/{video_id}").get("step", 0)
    image_status, image_s, _ = run_image(server, 3, args.steps, args.size)
    step_at_answer = get_json(f"{server.url}/v1/videos/{video_id}").get("step", 0)
    while True:
        video = get_json(f"{server.url}/v1/videos/{video_id}")
        if video["status"] in ("completed", "failed", "cancelled"):
            break
        time.sleep(0.2)
    video_s = time.perf_counter() - start
    report["hol"] = {"video_frames": args.hol_frames, "video_steps": video_steps, "video_status": video["status"], "video_s": video_s,
                     "image_status": image_status, "image_s": image_s, "image_steps": args.steps,
                     "video_step_at_image_send": step_at_send, "video_step_at_image_answer": step_at_answer}
    print(f"hol: image sent at video step {step_at_send}/{video_steps}, answered ({image_status}) in {image_s:.2f} s at video step "
          f"{step_at_answer}; the video ended {video['status']} after {video_s:.2f} s", flush=True)


def case_mixed(server: Server, args: argparse.Namespace, report: dict) -> None:
    kinds = ["image"] * 75 + ["video"] * 25
    random.Random(5).shuffle(kinds)
    before = server.metrics()
    lock, queue = threading.Lock(), list(enumerate(kinds))
    outcomes: list[tuple[str, int | str, float]] = []

    def client() -> None:
        while True:
            with lock:
                if not queue:
                    return
                i, kind = queue.pop(0)
            try:
                if kind == "image":
                    status, elapsed, _ = run_image(server, 1000 + i, args.steps, args.size)
                else:
                    status, elapsed, _ = run_video_sync(server, 1000 + i, args.steps, args.size, args.video_frames)
            except Exception as error:
                status, elapsed = f"lost: {error!r}", float("nan")
            with lock:
                outcomes.append((kind, status, elapsed))

    threads = [threading.Thread(target=client) for _ in range(16)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    after = server.metrics()
    succeeded = after.get('tessel_requests_total{status="succeeded"}', 0) - before.get('tessel_requests_total{status="succeeded"}', 0)
    statuses: dict[str, int] = {}
    for _, status, _ in outcomes:
        statuses[str(status)] = statuses.get(str(status), 0) + 1
    latency = {kind: [e for k, s, e in outcomes if k == kind and s == 200] for kind in ("image", "video")}
    report["mixed"] = {"requests": len(kinds), "clients": 16, "wall_s": wall, "statuses": statuses,
                       "answered": len(outcomes), "lost": sum(1 for _, s, _ in outcomes if not isinstance(s, int)),
                       "server_succeeded": succeeded,
                       **{f"{kind}_p50_s": percentile(v, 50) for kind, v in latency.items()},
                       **{f"{kind}_p99_s": percentile(v, 99) for kind, v in latency.items()},
                       **{f"{kind}_mean_s": statistics.fmean(v) if v else float("nan") for kind, v in latency.items()}}
    m = report["mixed"]
    print(f"mixed: {len(kinds)} requests from 16 clients in {wall:.1f} s, statuses {statuses}, lost {m['lost']}, "
          f"server succeeded {succeeded:.0f}; image p50/p99 {m['image_p50_s']:.2f}/{m['image_p99_s']:.2f} s, "
          f"video p50/p99 {m['video_p50_s']:.2f}/{m['video_p99_s']:.2f} s", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tessel", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--port", type=int, default=8311)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--size", default="832x480")
    parser.add_argument("--video-frames", type=int, default=17)
    parser.add_argument("--hol-frames", type=int, default=33)
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--start-timeout", type=float, default=600.0)
    parser.add_argument("--log", default="serve_batching.log")
    parser.add_argument("--json-out")
    parser.add_argument("--serve-args", nargs=argparse.REMAINDER, default=[], help="passed on to tessel serve (last)")
    args = parser.parse_args()
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown or not cases:
        parser.error(f"--cases: unknown {unknown}; choose from {', '.join(CASES)}")
    report: dict = {"device": args.device, "model": args.model, "max_batch": args.max_batch}
    server = Server(args, args.log)
    try:
        for case in cases:
            globals()[f"case_{case}"](server, args, report)
    finally:
        server.stop()
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report, f, indent=2)
    print("\n| case | result |\n|---|---|")
    if "images" in report:
        r = report["images"]
        print(f"| 8 images {r['size']}, {r['steps']} steps | one after another {r['sequential_s']:.2f} s, at once "
              f"{r['concurrent_s']:.2f} s: **{r['speedup']:.2f}x**; {r['png_bit_equal']}/8 PNG bit-equal, largest pixel "
              f"difference {r['largest_pixel_difference']} |")
    if "videos" in report:
        r = report["videos"]
        print(f"| 4 videos {r['frames']} frames | {r['sequential_s']:.2f} s against {r['concurrent_s']:.2f} s: **{r['speedup']:.2f}x**; "
              f"{r['bit_equal']}/4 bit-equal |")
    if "hol" in report:
        r = report["hol"]
        print(f"| image during a {r['video_steps']}-step video | sent at video step {r['video_step_at_image_send']}, answered in "
              f"{r['image_s']:.2f} s at video step {r['video_step_at_image_answer']}; video {r['video_s']:.2f} s |")
    if "mixed" in report:
        r = report["mixed"]
        print(f"| 100 mixed, 16 clients | {r['wall_s']:.1f} s, {r['statuses']}, lost {r['lost']}, server succeeded "
              f"{r['server_succeeded']:.0f}; image p50/p99 {r['image_p50_s']:.2f}/{r['image_p99_s']:.2f} s, video "
              f"{r['video_p50_s']:.2f}/{r['video_p99_s']:.2f} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
