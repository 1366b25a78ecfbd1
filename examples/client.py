"""Example client of `tessel serve`: an image through the OpenAI images API (the `openai`
package), then a video job through plain HTTP (create, poll its progress, download, delete).

    tessel init-model --out tiny-wan
    tessel serve --model tiny-wan --size 64x64 --frames 9 --steps 4 &
    python examples/client.py --base-url http://127.0.0.1:8000 [--api-key KEY]

Images come back as PNG (MP4 for videos) when the model directory has a vae/, otherwise as the
latents in a safetensors file.
"""
import argparse
import base64
import json
import time
import urllib.error
import urllib.request


def http_json(method, url, api_key, body=None):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    with urllib.request.urlopen(request, timeout=600) as response:
        return response.status, response.headers.get("Content-Type", ""), response.read()


def image(base_url, api_key, prompt):
    from openai import OpenAI  # pip install openai

    client = OpenAI(base_url=f"{base_url}/v1", api_key=api_key or "unused")
    result = client.images.generate(
        prompt=prompt,
        n=1,
        size="64x64",
        response_format="b64_json",
        extra_body={"num_inference_steps": 4, "guidance_scale": 5.0, "seed": 42, "negative_prompt": "blurry"},
    )
    data = base64.b64decode(result.data[0].b64_json)
    name = "image.png" if data[1:4] == b"PNG" else "image.safetensors"
    with open(name, "wb") as file:
        file.write(data)
    print(f"image: {name} ({len(data)} bytes)")


def video(base_url, api_key, prompt):
    _, _, body = http_json("POST", f"{base_url}/v1/videos", api_key,
                           {"prompt": prompt, "size": "64x64", "num_frames": 9, "num_inference_steps": 4, "seed": 7})
    job = json.loads(body)
    print(f"video job {job['id']}: {job['status']}")
    while job["status"] in ("queued", "in_progress"):
        time.sleep(0.2)
        _, _, body = http_json("GET", f"{base_url}/v1/videos/{job['id']}", api_key)
        job = json.loads(body)
        print(f"  {job['status']}: step {job['step']}/{job['total_steps']}, {job['progress']}%, eta {job['eta_seconds']:.1f} s")
    if job["status"] != "completed":
        raise SystemExit(f"video {job['id']} {job['status']}: {job.get('error')}")
    _, content_type, data = http_json("GET", f"{base_url}/v1/videos/{job['id']}/content", api_key)
    name = "video.mp4" if content_type == "video/mp4" else "video.safetensors"
    with open(name, "wb") as file:
        file.write(data)
    print(f"video: {name} ({len(data)} bytes)")
    http_json("DELETE", f"{base_url}/v1/videos/{job['id']}", api_key)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--api-key", default="")
    parser.add_argument("--prompt", default="a red cube on a table")
    parser.add_argument("--skip-image", action="store_true", help="only the video (no openai package needed)")
    args = parser.parse_args()
    try:
        if not args.skip_image:
            image(args.base_url, args.api_key, args.prompt)
        video(args.base_url, args.api_key, args.prompt)
    except urllib.error.HTTPError as error:
        raise SystemExit(f"HTTP {error.code}: {error.read().decode()}")


if __name__ == "__main__":
    main()
