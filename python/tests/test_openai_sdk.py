"""`tessel serve` with the OpenAI Python SDK as the client (the tiny random model on the CPU):
images.generate, the video job API (videos.create as the SDK sends it, multipart/form-data;
retrieve, list with pagination, download_content, delete) and what is not built refused as an
OpenAI-shaped 400 the SDK raises as BadRequestError."""
import base64
import re
import subprocess
import time
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")
from tessel.testing import write_random_wan_model  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
CLI = REPO_ROOT / "build" / "bin" / "tessel"
pytestmark = pytest.mark.skipif(not CLI.is_file(), reason=f"the tessel CLI is not built at {CLI} (make builds it)")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("openai_sdk")
    model = root / "tiny"
    assert write_random_wan_model(model, "tiny", seed=11) == 0
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
        for _ in range(1200):
            video = client.videos.retrieve(video.id)
            if video.status in ("completed", "failed", "cancelled"):
                break
            time.sleep(0.05)
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


def test_what_is_not_built_is_a_bad_request(server):
    client, model = server
    with pytest.raises(openai.BadRequestError, match="input_reference"):
        client.videos.create(prompt="a ball", model=model, input_reference=("ref.png", b"\x89PNG\r\n", "image/png"))
    with pytest.raises(openai.BadRequestError, match="images/edits"):
        client.images.edit(image=("in.png", b"\x89PNG\r\n", "image/png"), prompt="a ball")
    with pytest.raises(openai.NotFoundError, match="model"):
        client.images.generate(prompt="a cube", model="dall-e-3", response_format="b64_json")
