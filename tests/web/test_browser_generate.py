"""The text generation demo (/generate) in Debian's chromium, driven by Playwright, against the real app under
uvicorn: the page asks the service for the character model (compiled through the job queue on that first visit),
loads it with tessel.js and generates with model.generate; the characters it shows must be the ones Python's
Module.generate picks for the same prompt. Screenshots go to each test's pytest tmp dir, under screenshots/."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest

from compiler import compile_model
from compiler.data import train_chars
from tests.web.test_browser import serve_app

PROMPT = "The compiler "
COMPILE_TIMEOUT_MS = 240_000
# Generate, then Stop from a timer set as the fifth character is shown: the timer runs only if the page lets other
# tasks (clicks, timers, drawing) run between characters, as it must for a person's click on Stop to land.
STOP_AFTER_FIVE = """() => new Promise((resolve) => {
  const count = document.getElementById("count");
  const observer = new MutationObserver(() => {
    if (Number(count.textContent) < 5) return;
    observer.disconnect();
    const status = document.getElementById("status").textContent;
    setTimeout(() => {
      document.getElementById("stop").click();
      resolve(status);
    }, 0);
  });
  observer.observe(count, { childList: true, characterData: true, subtree: true });
  document.getElementById("generate").click();
})"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The real app on 127.0.0.1 with nothing prebuilt: the page's first visit queues the text model."""
    from server.app import create_app

    app = create_app(tmp_path_factory.mktemp("store"), max_workers=1)
    yield from serve_app(app)


@pytest.fixture(scope="module")
def module():
    """The same model compiled here, for the tokens Python's Module.generate picks."""
    return compile_model(str(train_chars.MODEL_PATH), target="wasm", dims=train_chars.dims())


@pytest.fixture(scope="module")
def characters():
    return train_chars.load_vocabulary()["vocabulary"]


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def _open_ready(page, server):
    page.goto(f"{server}/generate")
    page.wait_for_function("document.body.dataset.state === 'ready'", timeout=COMPILE_TIMEOUT_MS)
    assert page.evaluate("crossOriginIsolated")


def _generate(page, prompt: str, count: int, temperature: float = 0, **fields) -> dict:
    page.fill("#prompt", prompt)
    page.fill("#max-tokens", str(count))
    page.fill("#temperature", str(temperature))
    for name, value in fields.items():
        page.fill(f"#{name}", str(value))
    page.click("#generate")
    page.wait_for_function("['done', 'failed', 'stopped'].includes(document.body.dataset.state)", timeout=60_000)
    return page.evaluate("window.tesselGenerate")


def _chunked(module, prompt: list[int], count: int, context: int) -> list[int]:
    """What the page does for a text longer than the model's context (generate.js nextChunk): each chunk goes on from
    as much of the text as fits with the characters still to come, at least its last context / 2."""
    text, tokens = list(prompt), []
    while len(tokens) < count:
        remaining = count - len(tokens)
        length = min(len(text), max(context // 2, context + 1 - remaining))
        new = module.generate(text[-length:], min(remaining, context + 1 - length)).tolist()
        tokens += new
        text += new
    return tokens


@pytest.mark.slow
def test_the_page_writes_what_module_generate_writes(server, page, module, characters, tmp_path):
    about = _get_json(f"{server}/api/text-model")
    assert about["vocabulary"] == characters and about["context"] == train_chars.CONTEXT
    _open_ready(page, server)
    assert _get_json(f"{server}/api/text-model")["job"] == about["job"], "a second visit queued the model again"
    result = _generate(page, PROMPT, 40)
    page.screenshot(path=str(tmp_path / "generated.png"), full_page=True)
    assert result["state"] == "done", page.inner_text("#error")
    prompt = train_chars.encode(PROMPT, characters)
    want = module.generate(prompt, 40).tolist()
    assert result["prompt"] == prompt and result["tokens"] == want and result["chunks"] == 1
    assert page.inner_text("#output") == PROMPT + train_chars.decode(want, characters)
    assert page.inner_text("#count") == "40" and page.inner_text("#backend") == "wasm"
    assert "chars/s" in page.inner_text("#speed")


@pytest.mark.slow
def test_a_text_longer_than_the_context_goes_on_in_chunks(server, page, module, characters):
    prompt = "A model exported with a symbolic dimension compiles once and runs every size in a range you give. "
    _open_ready(page, server)
    result = _generate(page, prompt, 90)
    assert result["state"] == "done" and result["chunks"] == 2, result
    ids = train_chars.encode(prompt, characters)
    assert result["tokens"] == _chunked(module, ids, 90, train_chars.CONTEXT)


@pytest.mark.slow
def test_sampling_is_seeded_and_stop_ends_it(server, page, characters):
    _open_ready(page, server)
    first = _generate(page, PROMPT, 30, temperature=0.8, seed=7, **{"top-k": 20})
    again = _generate(page, PROMPT, 30, temperature=0.8, seed=7, **{"top-k": 20})
    assert first["tokens"] == again["tokens"] and first["seed"] == 7 and len(first["tokens"]) == 30
    # unknown characters are left out of the prompt, and said so
    page.fill("#prompt", "caf\u00e9 ")
    page.fill("#max-tokens", "2000")
    status = page.evaluate(STOP_AFTER_FIVE)
    assert "left out 1 character the model does not know" in status
    page.wait_for_function("document.body.dataset.state === 'stopped'")
    result = page.evaluate("window.tesselGenerate")
    assert 5 <= len(result["tokens"]) < 2000 and result["prompt"] == train_chars.encode("caf ", characters)
    assert page.inner_text("#output") == "caf " + train_chars.decode(result["tokens"], characters)
    assert page.is_enabled("#generate") and page.is_disabled("#stop")


def test_the_pages_link_the_demo(server, page):
    for path in ("/", "/static/demo.html"):
        page.goto(f"{server}{path}")
        assert page.get_attribute("#generate-link", "href") == "/generate"


def test_prebuild_chars_compiles_the_text_model_at_start_up(tmp_path):
    """`--prebuild chars` queues the model at start-up with its symbolic sizes; /api/text-model then names that job,
    and its bundle is stored under a key of its own (the sizes are part of it). After a failure, a new visit queues the
    model again (its stored bundle reused at once)."""
    from starlette.testclient import TestClient

    from server.app import create_app
    from server.jobs import bundle_key

    app = create_app(tmp_path / "var", max_workers=1, prebuild=("chars",))
    with TestClient(app) as client:
        about = client.get("/api/text-model").json()
        deadline = time.monotonic() + 240
        while (job := client.get(about["url"]).json())["state"] not in ("done", "failed"):
            assert time.monotonic() < deadline, job
            time.sleep(0.1)
        assert job["state"] == "done", job["error"]
        assert job["dims"] == {
            "past": [0, train_chars.CONTEXT - 1],
            "seq": [1, train_chars.CONTEXT],
            "total": "past+seq",
        }
        after = client.get("/api/text-model").json()
        assert after["job"] == about["job"] and after["bundle"] == job["result"]["bundles"]["wasm"]["url"]
        manifest = client.get(f"{after['bundle']}manifest.json").json()
        assert {size["name"]: (size["min"], size["max"]) for size in manifest["sizes"]} == {
            "past": (0, train_chars.CONTEXT - 1),
            "seq": (1, train_chars.CONTEXT),
        }
        digest = job["model"]["sha256"]
        assert after["bundle"] == f"/bundles/{bundle_key(digest, 'wasm', {}, dims=job['dims'])}/"
        assert after["bundle"] != f"/bundles/{bundle_key(digest, 'wasm', {})}/"
        page = client.get("/generate")
        assert page.status_code == 200 and "generate.js" in page.text
        # a failed job is reported to the page that follows it (?job=), and queued again on a new visit
        app.state.queue.jobs[about["job"]].state = "failed"
        assert client.get(f"/api/text-model?job={about['job']}").json()["state"] == "failed"
        again = client.get("/api/text-model").json()
        assert again["job"] != about["job"] and again["state"] == "done" and again["bundle"] == after["bundle"]
