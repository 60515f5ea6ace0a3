"""The web page of `pyggml serve` in a real browser: headless Chromium (Debian's chromium and
chromium-driver, installed by `make setup`) driven by Selenium, against SmolLM2 servers on free
loopback ports. One browser for the module; every wait is bounded (WAIT_S); screenshots of each
view go to build/web-screenshots/ for a person to look at.

Skips, saying so, only when chromium or chromedriver is not installed."""
import json
import shutil
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest

from pyggml.cli import main
from pyggml.llm.runtime import LLM
from pyggml.models_pypi import ensure_smollm2
from pyggml.server import make_server, start_in_thread
from support.serve_process import ServeProcess
from support.http_server import TWO_VIRTUAL_GPUS as TWO_GPUS

REPO = Path(__file__).resolve().parent.parent
SHOTS = REPO / "build" / "web-screenshots"
WEB = REPO / "pyggml" / "server" / "web"
WAIT_S = 30
CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))
                 if p), None)
CHROMEDRIVER = shutil.which("chromedriver")

pytestmark = [
    pytest.mark.skipif(CHROMIUM is None or CHROMEDRIVER is None,
                       reason="chromium / chromedriver not installed (apt-get install chromium "
                              "chromium-driver; tools/setup_system.sh does it)"),
    pytest.mark.timeout(300),
]

SYSTEM = "You are a helpful assistant."
QUESTION = "Name the largest planet of the solar system."


@pytest.fixture(scope="module")
def smol_path():
    return str(ensure_smollm2())


@pytest.fixture(scope="module")
def server(smol_path):
    llm = LLM(smol_path, n_ctx=2048, n_threads=2, n_seq_max=2)
    rs = start_in_thread(make_server(llm, 2, "smollm2"))
    yield f"http://127.0.0.1:{rs.port}", llm, rs
    rs.stop()
    llm.close()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
              "--window-size=1400,950", "--no-first-run", "--disable-extensions",
              "--disable-background-networking", "--disable-component-update",
              "--disable-sync", "--disable-default-apps", "--metrics-recording-only",
              f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    # an explicit driver: Selenium Manager (which downloads drivers) never runs
    drv = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    drv.set_page_load_timeout(WAIT_S)
    drv.set_script_timeout(WAIT_S)
    SHOTS.mkdir(parents=True, exist_ok=True)
    drv.requests_seen = []
    yield drv
    drv.quit()


# ---- helpers -----------------------------------------------------------------------------------

def wait(drv, cond, what: str, timeout: float = WAIT_S):
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait
    try:
        return WebDriverWait(drv, timeout, poll_frequency=0.05).until(lambda d: cond(d))
    except TimeoutException:
        raise AssertionError(f"timed out after {timeout} s waiting for {what}") from None


def js(drv, script, *args):
    return drv.execute_script(script, *args)


def by_id(drv, id_):
    from selenium.webdriver.common.by import By
    return drv.find_element(By.ID, id_)


def css(drv, sel):
    from selenium.webdriver.common.by import By
    return drv.find_elements(By.CSS_SELECTOR, sel)


def network(drv) -> list[dict]:
    """The page's requests since the last call (Chromium's performance log): url, bytes."""
    out, by_id_ = [], {}
    for e in drv.get_log("performance"):
        m = json.loads(e["message"])["message"]
        p = m.get("params", {})
        if m["method"] == "Network.requestWillBeSent":
            r = {"url": p["request"]["url"], "bytes": 0}
            by_id_[p["requestId"]] = r
            out.append(r)
        elif m["method"] == "Network.loadingFinished" and p.get("requestId") in by_id_:
            by_id_[p["requestId"]]["bytes"] = p.get("encodedDataLength", 0)
    drv.requests_seen.extend(out)
    return out


NETWORK_SCHEMES = ("http", "https", "ws", "wss", "ftp")    # the rest stay in the browser


def assert_all_local(drv) -> None:
    """No request left the machine: every network URL the log saw is loopback (data:, and the
    browser's own chrome:// pages, never reach a network). And the page raised no script error
    and broke no rule of its Content-Security-Policy."""
    bad = [e["message"] for e in drv.get_log("browser")
           if "Uncaught" in e["message"] or "Content Security Policy" in e["message"]]
    assert not bad, bad
    network(drv)
    seen = [r for r in drv.requests_seen if urlparse(r["url"]).scheme in NETWORK_SCHEMES]
    assert seen, "the performance log recorded no request at all"
    for r in seen:
        assert urlparse(r["url"]).hostname in ("127.0.0.1", "localhost", "::1"), r["url"]


def open_page(drv, base, view="chat"):
    drv.get("about:blank")                  # the same URL again would only change the hash
    drv.get(f"{base}/#{view}")
    wait(drv, lambda d: js(d, "return document.body.dataset.ready === '1'"), "the page to start")


def goto(drv, view):
    js(drv, f"location.hash = '#{view}'")
    wait(drv, lambda d: "hidden" not in by_id(d, f"view-{view}").get_attribute("class"),
         f"the {view} view")


def texts(drv, sel) -> list[str]:
    """innerText of the elements matching `sel`, read in one go (the Live view re-renders every
    second: an element found in one call may be gone in the next)."""
    return js(drv, "return [...document.querySelectorAll(arguments[0])].map((e) => e.innerText);",
              sel)


def card_value(drv, id_) -> str:
    return (texts(drv, f"#{id_} .stat-value") or [""])[0]


def set_value(drv, id_, value) -> None:
    js(drv, "const e = document.getElementById(arguments[0]); e.value = arguments[1];"
            "e.dispatchEvent(new Event('change'));", id_, value)


def last_reply(drv) -> dict:
    return js(drv, """
        const els = document.querySelectorAll('#messages .msg.assistant');
        const el = els[els.length - 1];
        if (!el) return null;
        const convs = JSON.parse(localStorage.getItem('pyggml.conversations') || '[]');
        const cur = JSON.parse(localStorage.getItem('pyggml.current'));
        const c = convs.find((x) => x.id === cur);
        const m = c ? c.messages[c.messages.length - 1] : null;
        return {state: el.dataset.state, chunks: +(el.dataset.chunks || 0),
                text: el.querySelector('.body').textContent,
                stats: el.querySelector('.stats').textContent, raw: m ? m.content : null};""")


def send_message(drv, text, *, temperature, max_tokens) -> None:
    set_value(drv, "system", SYSTEM)
    set_value(drv, "temperature", str(temperature))
    set_value(drv, "max-tokens", str(max_tokens))
    js(drv, "document.getElementById('new-chat').click()")
    by_id(drv, "input").send_keys(text)
    by_id(drv, "send").click()


def shot(drv, name, whole=False) -> Path:
    """A screenshot of the window; whole: tall enough for the whole view (no scrolling)."""
    path = SHOTS / f"{name}.png"
    if whole:
        h = js(drv, "return document.querySelector('main').scrollHeight + "
                    "document.querySelector('header').offsetHeight;")
        drv.set_window_size(1400, min(8000, h + 160))
        time.sleep(0.2)
    drv.save_screenshot(str(path))
    if whole:
        drv.set_window_size(1400, 950)
    assert path.stat().st_size > 10_000
    return path


def mem_json(tmp_path, args) -> dict:
    out = tmp_path / "mem.json"
    assert main(["mem", "-m", str(ensure_smollm2())] + args + ["--json", str(out)]) == 0
    return json.loads(out.read_text())["plan"]


def page_devices(drv) -> dict:
    return js(drv, """
        const out = {};
        for (const tr of document.querySelectorAll('#device-table tbody tr')) {
          const row = {};
          for (const td of tr.querySelectorAll('td[data-bytes]'))
            row[td.dataset.field] = td.dataset.bytes === '' ? null : Number(td.dataset.bytes);
          out[tr.dataset.device] = row;
        }
        return out;""")


def assert_same_bytes_as_mem(drv, plan) -> None:
    page = page_devices(drv)
    assert set(page) == {d["device"] for d in plan["devices"]}
    for d in plan["devices"]:
        row = page[d["device"]]
        for f in ("weights", "kv", "compute", "staging", "total"):
            assert row[f] == d[f], (d["device"], f, row[f], d[f])
        if d["device"] != "CPU":            # the CPU's free memory moves between two reads
            assert row["free"] == d["memory"][0], d["device"]
    bars = [t.text for t in css(drv, "#plan-body svg.bars text.dev-label")]
    assert bars == [d["device"] for d in plan["devices"]]


# ---- tests -------------------------------------------------------------------------------------

def test_page_loads_fast_small_and_offline(browser, server):
    base, _, _ = server
    assert sum(p.stat().st_size for p in WEB.iterdir()) < 300_000
    network(browser)
    open_page(browser, base)
    ms = js(browser, "const n = performance.getEntriesByType('navigation')[0];"
                     "return n.loadEventEnd - n.startTime;")
    assert 0 < ms < 1000, f"the page took {ms:.0f} ms to load from loopback"
    reqs = network(browser)
    assets = [r for r in reqs if r["url"].startswith(base) and
              urlparse(r["url"]).path in ("/", "/web/app.js", "/web/app.css")]
    assert len(assets) == 3 and sum(r["bytes"] for r in assets) < 300_000
    assert by_id(browser, "model-name").text.startswith("smollm2")
    assert_all_local(browser)


def test_chat_streams_and_equals_the_greedy_api_reply(browser, server):
    base, _, _ = server
    open_page(browser, base)
    send_message(browser, QUESTION, temperature=0, max_tokens=48)
    r = wait(browser, lambda d: (x := last_reply(d)) and x["state"] != "streaming" and x,
             "the reply to finish", 90)
    api = httpx.post(f"{base}/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}],
        "temperature": 0, "max_tokens": 48}).json()
    want = api["choices"][0]["message"]["content"]
    assert r["state"] == "done" and r["raw"] == want and want
    assert r["chunks"] > 1                                   # it arrived in pieces
    assert " ".join(r["text"].split())[:20] == " ".join(want.split())[:20]
    assert f"{api['usage']['completion_tokens']} tokens" in r["stats"]
    assert "tokens/s" in r["stats"] and f"prompt {api['usage']['prompt_tokens']}" in r["stats"]
    # a code block and markdown render as such
    js(browser, """
        const convs = JSON.parse(localStorage.getItem('pyggml.conversations'));
        convs[0].messages.push({role: 'assistant', content: 'Here is **bold**, `code` and ' +
          'a list:\\n\\n- one\\n- two\\n\\n```python\\nprint(1 < 2)\\n```'});
        localStorage.setItem('pyggml.conversations', JSON.stringify(convs));""")
    open_page(browser, base)                # the conversation comes back from local storage
    msgs = css(browser, "#messages .msg")
    assert [m.get_attribute("class") for m in msgs] == ["msg user", "msg assistant"] * 1 + \
        ["msg assistant"]
    assert msgs[0].find_element("css selector", ".body").text == QUESTION
    assert css(browser, "#conv-list li.active")[0].text.startswith(QUESTION[:20])
    assert css(browser, "#messages .msg.assistant:last-child pre code.lang-python")[0].text == \
        "print(1 < 2)"
    assert len(css(browser, "#messages .msg.assistant:last-child li")) == 2
    assert css(browser, "#messages .msg.assistant:last-child strong")[0].text == "bold"
    shot(browser, "chat")
    assert_all_local(browser)


def test_stop_mid_reply_frees_the_slot(browser, server):
    base, _, rs = server
    open_page(browser, base)
    cancelled = rs.server.engine.metrics.requests_cancelled_total
    send_message(browser, "Write a very long story about a dragon and a knight.",
                 temperature=0.8, max_tokens=900)
    n1 = wait(browser, lambda d: len((last_reply(d) or {}).get("text") or "") > 20 and
              len(last_reply(d)["text"]), "streamed text to arrive")
    wait(browser, lambda d: len(last_reply(d)["text"]) > n1 + 10, "more streamed text")
    assert last_reply(browser)["state"] == "streaming"
    by_id(browser, "stop").click()
    r = wait(browser, lambda d: (x := last_reply(d))["state"] != "streaming" and x, "the stop")
    assert r["state"] == "stopped" and "stopped" in r["stats"]
    wait(browser, lambda d: httpx.get(f"{base}/v1/pyggml/live", timeout=5).json()["slots_busy"]
         == 0, "the server to free the slot", 10)
    assert rs.server.engine.metrics.requests_cancelled_total == cancelled + 1
    time.sleep(0.3)
    assert last_reply(browser)["raw"] == r["raw"]           # nothing arrives after the stop
    assert "hidden" in by_id(browser, "stop").get_attribute("class")
    assert_all_local(browser)


def test_phone_width_every_view_fits_and_the_chat_panels_open(browser, server):
    """At a phone's width (390 CSS px) the tabs stay on screen, no view is wider than the
    window, and the conversations and settings (hidden beside the chat) open as panels."""
    base, _, _ = server
    browser.set_window_size(390, 844)
    try:
        open_page(browser, base)
        for view in ("chat", "model", "live"):
            goto(browser, view)
            if view == "model":
                wait(browser, lambda d: css(d, "#plan-body .fact"), "the plan")
            fit = js(browser, "return [innerWidth, document.documentElement.scrollWidth,"
                              "[...document.querySelectorAll('.tab')].map((t) => {"
                              "  const r = t.getBoundingClientRect(); return [r.left, r.right];})]")
            width, scroll, tabs = fit
            assert scroll <= width, (view, fit)
            assert all(0 <= left and right <= width for left, right in tabs), (view, fit)
            shot(browser, f"phone-{view}")
        goto(browser, "chat")
        assert not by_id(browser, "temperature").is_displayed()
        by_id(browser, "show-settings").click()
        wait(browser, lambda d: by_id(d, "temperature").is_displayed(), "the settings panel")
        by_id(browser, "show-convs").click()
        wait(browser, lambda d: by_id(d, "new-chat").is_displayed(), "the conversations panel")
        assert not by_id(browser, "temperature").is_displayed()
        by_id(browser, "new-chat").click()          # choosing closes the panel
        wait(browser, lambda d: not by_id(d, "new-chat").is_displayed(), "the panel to close")
    finally:
        browser.set_window_size(1400, 950)


def test_model_view_running_plan(browser, server):
    base, llm, _ = server
    open_page(browser, base, "model")
    wait(browser, lambda d: by_id(d, "view-model").get_attribute("data-state") == "ready",
         "the running plan")
    page = page_devices(browser)
    assert list(page) == ["CPU"]
    assert page["CPU"]["kv"] == llm.kv.n_bytes
    assert page["CPU"]["compute"] == llm.compute_buffer_size("CPU")
    shot(browser, "model-running", whole=True)
    text = by_id(browser, "plan-body").text
    for what in ("llama", "30", "q4_1", "Where each layer lives", "blk.0–",
                 "token embeddings stay on the CPU", "1.wgt0", "the planned buffer is"):
        assert what in text, what
    assert_all_local(browser)


def test_model_view_what_if_equals_pyggml_mem(browser, server, tmp_path):
    base, _, _ = server
    open_page(browser, base, "model")
    wait(browser, lambda d: by_id(d, "view-model").get_attribute("data-state") == "ready",
         "the running plan")
    args = "-ngl 99 --virtual-device laptop=256MiB -c 1024 -ub 128"
    set_value(browser, "plan-args", args)
    set_value(browser, "plan-config", "")
    by_id(browser, "plan-run").click()
    wait(browser, lambda d: "What-if" in by_id(d, "plan-source").text and
         by_id(d, "view-model").get_attribute("data-state") == "ready", "the what-if plan")
    assert_same_bytes_as_mem(browser, mem_json(tmp_path, args.split()))
    # an offload config with two virtual GPUs, as a file for `pyggml mem`, as text in the page
    cfg = tmp_path / "two-gpus.yaml"
    cfg.write_text(TWO_GPUS)
    set_value(browser, "plan-args", "")
    set_value(browser, "plan-config", TWO_GPUS)
    by_id(browser, "plan-run").click()
    wait(browser, lambda d: "with the config" in by_id(d, "plan-source").text and
         by_id(d, "view-model").get_attribute("data-state") == "ready", "the config's plan")
    plan = mem_json(tmp_path, ["-c", str(cfg)])
    assert {d["device"] for d in plan["devices"]} == {"laptop", "egpu", "CPU"}
    assert_same_bytes_as_mem(browser, plan)
    assert len(css(browser, "#plan-body .tl-item")) >= 2          # a timeline per buffer
    shot(browser, "model-two-virtual-gpus", whole=True)
    # a GPU too small: the changes that fit, one click plans with one of them
    set_value(browser, "plan-config", "")
    set_value(browser, "plan-args", "-ngl 99 --virtual-device laptop=128MiB -c 4096")
    by_id(browser, "plan-run").click()
    wait(browser, lambda d: texts(d, "#fit-box button"), "the changes that fit")
    assert "laptop does not fit" in texts(browser, "#fit-box")[0]
    assert texts(browser, '#device-table tr[data-device="laptop"] td[data-field="fits"]') == \
        ["NO"]
    shot(browser, "model-does-not-fit", whole=True)
    css(browser, "#fit-box button")[0].click()
    wait(browser, lambda d: not texts(d, "#fit-box") and "--set" in by_id(d, "plan-source").text
         and by_id(d, "view-model").get_attribute("data-state") == "ready", "the fitting plan")
    assert set(texts(browser, '#device-table td[data-field="fits"]')) == {"yes"}
    # a bad flag: a readable error, the last plan stays
    set_value(browser, "plan-config", "")
    set_value(browser, "plan-args", "--no-such-flag")
    by_id(browser, "plan-run").click()
    wait(browser, lambda d: by_id(d, "view-model").get_attribute("data-state") == "error",
         "the error")
    assert "--no-such-flag" in by_id(browser, "plan-error").text
    set_value(browser, "plan-args", "")
    assert_all_local(browser)


def test_live_view_shows_a_busy_slot(browser, server):
    base, _, _ = server
    open_page(browser, base, "live")
    wait(browser, lambda d: by_id(d, "view-live").get_attribute("data-updated"), "live data")
    assert card_value(browser, "live-slots-busy") == "0 / 2"
    stop = threading.Event()

    def stream():
        # long enough for several 1 s polls of the page however fast decode is: no early end
        body = {"messages": [{"role": "user", "content": "Tell me a long story."}],
                "max_tokens": 900, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=60) as r:
            for _ in r.iter_lines():
                if stop.is_set():
                    return
    t = threading.Thread(target=stream, daemon=True)
    t.start()
    try:
        wait(browser, lambda d: card_value(d, "live-slots-busy") == "1 / 2" and
             texts(d, '#live-slots .slot[data-state="generating"]'), "a generating slot")
        wait(browser, lambda d: card_value(d, "live-tps") not in ("", "0"),
             "tokens per second", 10)
        info = texts(browser, '#live-slots .slot[data-state="generating"] .slot-info')
        assert info and int(info[0].split(" / ")[0]) > 0            # its KV cells
        assert texts(browser, "#live-chart svg rect")
        shot(browser, "live")
    finally:
        stop.set()
        t.join(30)
    assert_all_local(browser)


def test_api_key_then_the_server_goes_away(browser, smol_path):
    with ServeProcess(["-m", smol_path, "-np", "1", "-c", "512", "-t", "2",
                       "--api-key", "sesame"]) as srv:
        assert httpx.get(f"{srv.base}/", timeout=10).status_code == 200       # no key needed
        assert httpx.get(f"{srv.base}/v1/pyggml/live", timeout=10).status_code == 401
        browser.get(f"{srv.base}/#live")
        wait(browser, lambda d: by_id(d, "key-dialog").get_attribute("open") is not None,
             "the key dialog")
        shot(browser, "api-key")
        by_id(browser, "key-input").send_keys("wrong")
        by_id(browser, "key-save").click()
        wait(browser, lambda d: "refused" in by_id(d, "key-message").text, "the refusal")
        by_id(browser, "key-input").send_keys("sesame")
        by_id(browser, "key-save").click()
        wait(browser, lambda d: js(d, "return document.body.dataset.ready === '1'"),
             "the page to start with the key")
        wait(browser, lambda d: by_id(d, "view-live").get_attribute("data-updated"),
             "live data with the key")
        assert js(browser, "return JSON.parse(localStorage.getItem('pyggml.apiKey'))") == "sesame"
        # asked once: a reload goes straight in
        open_page(browser, srv.base, "live")
        assert by_id(browser, "key-dialog").get_attribute("open") is None
    # the server is gone: the page says so, readably
    wait(browser, lambda d: "hidden" not in by_id(d, "banner").get_attribute("class"),
         "the server-gone banner", 10)
    assert "does not answer" in by_id(browser, "banner").text
    shot(browser, "server-gone")
    assert_all_local(browser)
