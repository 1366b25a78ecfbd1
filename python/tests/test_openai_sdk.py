"""`tessel serve` with the OpenAI Python SDK as the client (the tiny random model on the CPU):
images.generate, the video job API (videos.create as the SDK sends it, multipart/form-data;
retrieve, list with pagination, download_content, delete), image to video (videos.create with
input_reference, as a file and as {"image_url": data URL}) on the tiny I2V preset, and what is not
served refused as an OpenAI-shaped 400 the SDK raises as BadRequestError."""
import base64
import re
import struct
import subprocess
import time
import zlib
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")
from tessel.testing import write_random_wan_model  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
CLI = REPO_ROOT / "build" / "bin" / "tessel"
pytestmark = pytest.mark.skipif(not CLI.is_file(), reason=f"the tessel CLI is not built at {CLI} (make builds it)")


def serve(root, preset):
    """Starts `tessel serve` on a new random model of `preset`; yields the client and the model's name."""
    model = root / preset
    assert write_random_wan_model(model, preset, seed=11) == 0
    log = root / "serve.log"
    with open(log, "w") as out:
        process = subprocess.Popen([str(CLI), "serve", "--model", str(model), "--port", "0", "--size", "64x64", "--frames", "5",
                                    "--steps", "2", "--threads", "1"], stdout=out, stderr=subprocess.STDOUT)
    port = None
    for _ in range(600):
        found = re.search(r"listening on http://[^:]+:(\d+)", log.read_text())
        if found:
            port = int(found.group(1))
            break
        if process.poll() is not None:
            break
        time.sleep(0.1)
    if port is None:
        process.kill()
        pytest.fail("the server did not start:\n" + log.read_text())
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=120)
    yield client, model.name
    process.terminate()
    process.wait(timeout=60)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from serve(tmp_path_factory.mktemp("openai_sdk"), "tiny")


@pytest.fixture(scope="module")
def i2v_server(tmp_path_factory):
    yield from serve(tmp_path_factory.mktemp("openai_sdk_i2v"), "tiny-i2v")


def png(width=56, height=40):
    """An 8-bit RGB gradient as PNG bytes (zlib alone: no imaging package needed)."""
    rows = b"".join(b"\0" + bytes((x * 4 + y * 3 + c * 80) % 256 for x in range(width) for c in range(3)) for y in range(height))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def finished(client, video):
    for _ in range(1200):
        video = client.videos.retrieve(video.id)
        if video.status in ("completed", "failed", "cancelled"):
            break
        time.sleep(0.05)
    return video


def test_images_generate(server):
    client, model = server
    result = client.images.generate(prompt="a red cube", model=model, size="64x64", n=2, response_format="b64_json")
    assert len(result.data) == 2
    for image in result.data:
        assert base64.b64decode(image.b64_json)[1:4] == b"PNG"


def test_video_jobs_through_the_sdk(server):
    client, model = server
    created = [client.videos.create(prompt=f"a rolling ball {i}", model=model, seconds="0.25", size="64x64") for i in range(3)]
    assert all(video.object == "video" for video in created)
    for video in created:
        video = finished(client, video)
        assert video.status == "completed", video
        assert video.progress == 100
    page = client.videos.list(limit=2)
    assert [v.id for v in page.data] == [created[2].id, created[1].id]
    assert page.has_more
    following = client.videos.list(limit=2, after=page.data[-1].id)
    assert [v.id for v in following.data] == [created[0].id]
    assert not following.has_more
    content = client.videos.download_content(created[0].id)
    assert len(content.read()) > 0
    deleted = client.videos.delete(created[0].id)
    assert deleted.id == created[0].id
    with pytest.raises(openai.NotFoundError):
        client.videos.retrieve(created[0].id)


def test_image_to_video_through_the_sdk(i2v_server):
    client, model = i2v_server
    reference = png()
    from_file = client.videos.create(prompt="a cat", model=model, seconds="0.25", size="64x64",
                                     input_reference=("ref.png", reference, "image/png"), extra_body={"seed": 3})
    data_url = "data:image/png;base64," + base64.b64encode(reference).decode()
    # videos.create (openai 3.57) refuses a dict client-side (files only): the JSON body through its client.post.
    from_url = client.post("/videos", cast_to=openai.types.Video, body={"prompt": "a cat", "model": model, "seconds": "0.25",
                                                                        "size": "64x64", "seed": 3, "input_reference": {"image_url": data_url}})
    contents = []
    for video in (from_file, from_url):
        video = finished(client, video)
        assert video.status == "completed", video
        contents.append(client.videos.download_content(video.id).read())
    assert len(contents[0]) > 0
    assert contents[0] == contents[1]  # the same image and seed, sent two ways
    with pytest.raises(openai.BadRequestError, match="input_reference"):
        client.videos.create(prompt="a cat", model=model, seconds="0.25", size="64x64")  # an i2v model needs the image
    with pytest.raises(openai.BadRequestError, match="remote fetching is not supported"):
        client.post("/videos", cast_to=openai.types.Video,
                    body={"prompt": "a cat", "model": model, "input_reference": {"image_url": "https://example.com/cat.png"}})
    with pytest.raises(openai.BadRequestError, match="input_reference"):
        client.videos.create(prompt="a cat", model=model, input_reference=("ref.png", reference[:60], "image/png"))


def test_what_is_not_served_is_a_bad_request(server):
    client, model = server
    with pytest.raises(openai.BadRequestError, match="input_reference.*t2v"):  # a text-to-video model
        client.videos.create(prompt="a ball", model=model, input_reference=("ref.png", png(), "image/png"))
    with pytest.raises(openai.BadRequestError, match="images/edits"):
        client.images.edit(image=("in.png", b"\x89PNG\r\n", "image/png"), prompt="a ball")
    with pytest.raises(openai.NotFoundError, match="model"):
        client.images.generate(prompt="a cube", model="dall-e-3", response_format="b64_json")
