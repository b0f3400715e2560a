"""The built book in a real browser, with the network off.

Debian's ``chromium`` (installed by scripts/env.sh where it can) opens every built page from
``file://`` URLs, headless, driven over the DevTools protocol through a pipe. Where the
machine allows it, Chromium runs in a network namespace of its own (``unshare -rn`` or
bubblewrap), so that nothing can be fetched; in every case the test records each request a
page makes and requires all of them to stay inside the build. Then, per page:

* at least as many images have loaded (``naturalWidth > 0``) as the page's source makes figures;
* the math is typeset: no raw ``\\(``, ``\\[`` or ``$$`` in the visible text, no MathJax error;
* no JavaScript error reached the console;
* the Colab button points at this page's notebook;
* every figure has alt text that says something (words, not a file name) and a caption;
* axe-core (pinned; scripts/env.sh installs it from npm into the virtual environment) finds no
  violation of the WCAG 2.1 A and AA rules;
* every figure is legible at 1280 px and on a phone (390 px): its smallest text, as drawn, is at
  least ``coursekit.book.MIN_TEXT_PX`` pixels high (the height ``show`` measured in the image,
  times the image's rendered width over its natural width); at 1280 px it fits the text column,
  and at 390 px it scrolls sideways inside its own frame, never the page.

Two screenshots per page (1280 and 390 px wide) go to ``_build/screenshots/`` so that a person can look;
not under CI (``CI`` set), where nobody does: whole-page captures, pasted and encoded, were ~60 % of
this test's time (measured on four pages: 23.7 s with them, 9.9 s without). ``COURSE_SCREENSHOTS=1``
or ``0`` decides either way.
"""
from __future__ import annotations

import base64
import fcntl
import io
import json
import os
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import coursekit
from coursekit.book import MIN_TEXT_PX
from bookcheck import PAGES, ROOT, alt_problem, figures_by_cell, read

# every page of the book: the executable chapters and the Markdown pages (intro, assignments, references)
ALL_PAGES = PAGES + sorted((ROOT / "book").glob("*.md"))

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser") if shutil.which(n)), None)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="Debian's chromium is not installed (scripts/env.sh installs it as root with apt-get): "
           "the browser test of the built book is skipped")

SHOTS = ROOT / "_build" / "screenshots"
# axe-core, installed by scripts/env.sh (COURSE_AXE_JS may name another copy of axe.min.js)
AXE_JS = Path(os.environ.get("COURSE_AXE_JS") or
              Path(sys.prefix) / "share" / "axe" / "node_modules" / "axe-core" / "axe.min.js")
WCAG = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]  # the rules of WCAG 2.1 levels A and AA
WIDTH, HEIGHT = 1280, 900
PHONE = 390  # CSS pixels: the width of a common phone held upright
TILE = 3000  # pixels of page per screenshot tile
HEADER = 120  # the sticky top bar and a margin
SCREENSHOTS = os.environ.get("COURSE_SCREENSHOTS", "0" if os.environ.get("CI") else "1") != "0"
TIMEOUT = 60  # seconds for one page to load and typeset


def _isolation() -> tuple[list[str], str]:
    """A command prefix that runs Chromium in a network namespace of its own: no interface
    but loopback, so nothing outside this machine can be reached. Probed by listing the
    interfaces a command sees there (no traffic is sent)."""
    probes = [(["unshare", "-rn"], "unshare -rn"),
              (["bwrap", "--dev-bind", "/", "/", "--unshare-net", "--die-with-parent"], "bubblewrap")]
    for prefix, name in probes:
        if shutil.which(prefix[0]):
            probe = subprocess.run(prefix + ["cat", "/proc/net/dev"], capture_output=True, text=True)
            interfaces = {line.split(":")[0].strip() for line in probe.stdout.splitlines() if ":" in line}
            if probe.returncode == 0 and interfaces <= {"lo"}:
                return prefix, name
    return [], "none (requests are still recorded and checked)"


class DevTools:
    """The Chrome DevTools protocol over ``--remote-debugging-pipe``: JSON messages, each
    ended by a NUL byte, written to the browser's fd 3 and read from its fd 4."""

    def __init__(self, prefix: list[str], profile: Path):
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        args = [CHROMIUM, "--headless=new", "--remote-debugging-pipe", "--no-sandbox",
                "--disable-gpu", "--no-first-run", "--no-default-browser-check",
                "--disable-background-networking", "--disable-component-update",
                "--disable-features=Translate,MediaRouter,OptimizationHints",
                f"--user-data-dir={profile}", f"--window-size={WIDTH},{HEIGHT}",
                "--hide-scrollbars", "about:blank"]

        def onto_fds_3_and_4():  # in the child, before exec: our pipe ends where Chromium expects them
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_browser_r, from_browser_w)]
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        self.log = profile / "chromium.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(prefix + args, preexec_fn=onto_fds_3_and_4, pass_fds=(3, 4),
                                         stdout=log, stderr=subprocess.STDOUT)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict] = []

    def send(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = TIMEOUT) -> dict:
        self._next_id += 1
        msg = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_browser, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self._read(timeout)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]
            self.events.append(reply)

    def wait_for(self, method: str, timeout: float = TIMEOUT) -> dict:
        for i, event in enumerate(self.events):
            if event.get("method") == method:
                return self.events.pop(i)
        while True:
            event = self._read(timeout)
            if event.get("method") == method:
                return event
            self.events.append(event)

    def _read(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._from_browser], [], [], max(0.0, left))
            if not ready:
                raise TimeoutError(f"no message from Chromium within {timeout} s")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                err = self.log.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"Chromium closed the pipe:\n{err}")
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(message)

    def close(self):
        try:
            self.send("Browser.close", timeout=10)
        except Exception:  # noqa: BLE001 - it may be gone already
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)


@pytest.fixture(scope="module")
def browser(built_book, tmp_path_factory):
    prefix, how = _isolation()
    print(f"\nbrowser network isolation: {how}")
    tools = DevTools(prefix, tmp_path_factory.mktemp("chromium-profile"))
    try:
        target = next(t for t in tools.send("Target.getTargets")["targetInfos"] if t["type"] == "page")
        session = tools.send("Target.attachToTarget", {"targetId": target["targetId"], "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            tools.send(f"{domain}.enable", session=session)
        assert AXE_JS.is_file(), (f"axe-core is not installed ({AXE_JS} is missing): run scripts/env.sh, "
                                  "which installs it with npm")
        # every page gets axe-core before its own scripts run; it fetches nothing
        tools.send("Page.addScriptToEvaluateOnNewDocument", {"source": AXE_JS.read_text()}, session=session)
        shutil.rmtree(SHOTS, ignore_errors=True)  # no stale screenshots of renamed pages
        SHOTS.mkdir(parents=True)
        yield tools, session, built_book
    finally:
        tools.close()


# Runs in the page once it has loaded: waits for MathJax and the images, then reports.
REPORT = """
(async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) { await MathJax.startup.promise; }
  const imgs = Array.from(document.querySelectorAll('article img'));
  await Promise.all(imgs.map(i => i.complete ? null : new Promise(r => { i.onload = i.onerror = r; })));
  const content = document.querySelector('article').cloneNode(true);
  content.querySelectorAll('pre, code, mjx-container, script').forEach(e => e.remove());
  const visible = document.querySelector('article').innerText;
  const prose = content.textContent;
  return JSON.stringify({
    loaded: imgs.filter(i => i.complete && i.naturalWidth > 0 && i.src.includes('/_images/')).length,
    broken: imgs.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src),
    raw_tex: ['\\\\(', '\\\\[', '$$'].filter(s => prose.includes(s)),
    typeset: document.querySelectorAll('mjx-container').length,
    math_errors: document.querySelectorAll('mjx-merror').length,
    colab: Array.from(document.querySelectorAll('a[href*="colab.research.google.com"]')).map(a => a.href),
    figures: imgs.filter(i => i.src.includes('/_images/')).map(i => {
      const fig = i.closest('figure');
      const cap = fig && fig.querySelector('figcaption');
      return {src: i.src.split('/').pop(), alt: i.getAttribute('alt') || '', caption: cap ? cap.innerText.trim() : ''};
    }),
    height: Math.ceil(document.documentElement.scrollHeight),
    chars: visible.length,
  });
})()
"""

# Runs after REPORT: axe-core's WCAG 2.1 A/AA rules on the whole page, violations only. No
# preloading: axe would fetch the page's stylesheets again with XMLHttpRequest, which file://
# pages may not do (errors in the console); only the rule css-orientation-lock reads them.
AXE = """
(async () => {
  const result = await axe.run(document, {runOnly: {type: 'tag', values: %s}, resultTypes: ['violations'],
                                          preload: false});
  return JSON.stringify(result.violations.map(v => ({
    id: v.id, impact: v.impact, help: v.help,
    nodes: v.nodes.map(n => n.target.join(' ')).slice(0, 3), count: v.nodes.length})));
})()
""" % json.dumps(WCAG)


# Runs at each width: how large each figure's smallest text is drawn, and whether it stays in its column.
LEGIBILITY = """
(async () => {
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  return JSON.stringify({
    figures: Array.from(document.querySelectorAll('article figure img')).filter(i => i.src.includes('/_images/')).map(i => {
      const fig = i.closest('figure'), box = fig.getBoundingClientRect();
      const text = Array.from(fig.classList).find(c => c.startsWith('course-text-'));
      return {src: i.src.split('/').pop(), natural: i.naturalWidth, shown: i.getBoundingClientRect().width,
              text_px: text ? Number(text.slice('course-text-'.length)) / 100 : null,
              frame: fig.clientWidth, right: box.right};
    }),
  });
})()
"""


def _legibility(tools, session, width: int) -> dict:
    tools.send("Emulation.setDeviceMetricsOverride",
               {"width": width, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": width < 600}, session=session)
    result = tools.send("Runtime.evaluate", {"expression": LEGIBILITY, "awaitPromise": True, "returnByValue": True},
                        session=session)
    return {"width": width, **json.loads(result["result"]["value"])}


def legibility_problems(report: dict) -> list[str]:
    """What keeps the figures of one page, at one width, from being read (LEGIBILITY's report,
    with the width of the screen). A phone's browser widens its layout to fit content that is
    too wide, so a figure's frame is checked against the screen's width, not the window's."""
    problems, wide = [], report["width"]
    for f in report["figures"]:
        if not f["text_px"]:
            problems.append(f"{f['src']}: no text size (show it with coursekit.book.show)")
            continue
        drawn = f["text_px"] * f["shown"] / f["natural"]
        if drawn < MIN_TEXT_PX - 0.05:
            problems.append(f"{f['src']}: smallest text {drawn:.1f} px at {wide} px, under {MIN_TEXT_PX}")
        if f["right"] > wide + 1:
            problems.append(f"{f['src']}: the figure runs off the screen at {wide} px")
        if wide >= WIDTH and f["shown"] > f["frame"] + 1:
            problems.append(f"{f['src']}: needs {f['shown']:.0f} px to be legible, the column has {f['frame']} "
                            "(larger text or fewer panels side by side)")
    return problems


def _whole_page_png(tools, session, height: int, width: int = WIDTH) -> bytes:
    """The whole page as one PNG, from viewport-sized tiles. (A single capture taller than
    about 8,000 pixels comes out garbled in headless Chromium.)"""
    from PIL import Image

    page = Image.new("RGB", (width, height), "white")
    tools.send("Emulation.setDeviceMetricsOverride",
               {"width": width, "height": TILE, "deviceScaleFactor": 1, "mobile": width < 600}, session=session)
    try:
        # tiles overlap by HEADER pixels, which are cut from every tile but the first: the
        # page's sticky top bar would otherwise cover a strip of content at each seam
        for y in range(0, height, TILE - HEADER):
            top = tools.send("Runtime.evaluate", {"expression": f"window.scrollTo(0, {y}); window.scrollY",
                                                  "returnByValue": True}, session=session)["result"]["value"]
            shot = Image.open(io.BytesIO(base64.b64decode(
                tools.send("Page.captureScreenshot", {"format": "png"}, session=session)["data"])))
            cut = 0 if top == 0 else HEADER
            page.paste(shot.crop((0, cut, width, shot.height)), (0, int(top) + cut))
            if top + TILE >= height:
                break
    finally:
        tools.send("Emulation.clearDeviceMetricsOverride", session=session)
    out = io.BytesIO()
    page.save(out, format="PNG")
    return out.getvalue()


def _problems(event: dict) -> str | None:
    method, params = event.get("method"), event.get("params", {})
    if method == "Runtime.exceptionThrown":
        details = params["exceptionDetails"]
        return f"exception: {details.get('exception', {}).get('description') or details.get('text')}"
    if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
        return "console.error: " + " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"])
    if method == "Log.entryAdded" and params["entry"]["level"] == "error":
        return f"log: {params['entry']['text']} {params['entry'].get('url', '')}"
    return None


@pytest.mark.parametrize("page", ALL_PAGES, ids=[p.name for p in ALL_PAGES])
def test_page_in_the_browser(browser, page):
    tools, session, built = browser
    html = built / "book" / f"{page.stem}.html"
    tools.events.clear()
    tools.send("Page.navigate", {"url": html.as_uri()}, session=session)
    tools.wait_for("Page.loadEventFired")
    result = tools.send("Runtime.evaluate", {"expression": REPORT, "awaitPromise": True, "returnByValue": True},
                        session=session)
    report = json.loads(result["result"]["value"])
    axe = tools.send("Runtime.evaluate", {"expression": AXE, "awaitPromise": True, "returnByValue": True},
                     session=session)
    assert "exceptionDetails" not in axe, f"{page.name}: axe-core did not run: {axe['exceptionDetails']}"
    violations = json.loads(axe["result"]["value"])

    if SCREENSHOTS:
        (SHOTS / f"{page.stem}.png").write_bytes(_whole_page_png(tools, session, report["height"]))
    legible = {w: _legibility(tools, session, w) for w in (WIDTH, PHONE)}
    if SCREENSHOTS:  # the page's height as laid out at the phone's width, where the legibility check left it
        phone_height = tools.send("Runtime.evaluate", {"expression": "document.documentElement.scrollHeight",
                                                       "returnByValue": True}, session=session)["result"]["value"]
        (SHOTS / f"{page.stem}-{PHONE}.png").write_bytes(_whole_page_png(tools, session, phone_height, PHONE))
    tools.send("Emulation.clearDeviceMetricsOverride", session=session)  # the next page opens at full width

    time.sleep(0.2)  # let late console messages arrive
    tools.send("Runtime.evaluate", {"expression": "1"}, session=session)
    requests = [e["params"]["request"]["url"] for e in tools.events if e.get("method") == "Network.requestWillBeSent"]
    errors = [p for p in map(_problems, tools.events) if p]

    outside = [u for u in requests if not u.startswith(("file://", "data:", "blob:", "about:"))]
    assert not outside, f"{page.name} requested {outside[:5]}: the book must work with no network"
    assert not errors, f"{page.name}: JavaScript errors in the console: {errors[:5]}"
    notebook = page.suffix == ".ipynb"
    want = sum(figures_by_cell(read(page)).values()) if notebook else 0
    assert report["loaded"] >= want, f"{page.name}: {report['loaded']} images loaded, {want} figures made; " \
                                     f"broken: {report['broken'][:3]}"
    assert not report["broken"], f"{page.name}: images that did not load: {report['broken'][:3]}"
    assert not report["raw_tex"], f"{page.name}: math not typeset, raw TeX {report['raw_tex']} in the text"
    if "$" in page.read_text():  # a page with math shows typeset formulas
        assert report["typeset"] > 0, f"{page.name}: no formula typeset (is MathJax in _build/html/_static?)"
    assert report["math_errors"] == 0, f"{page.name}: {report['math_errors']} formulas MathJax could not read"
    if notebook:
        target = f"https://colab.research.google.com/github/{coursekit.REPO}/blob/main/book/{page.name}"
        assert report["colab"] and all(link == target for link in report["colab"]), \
            f"{page.name}: Colab button points at {report['colab']}, not {target}"
    bad_alt = [(f["src"], why) for f in report["figures"] if (why := alt_problem(f))]
    assert not bad_alt, f"{page.name}: figures a screen reader cannot describe: {bad_alt[:3]}"
    uncaptioned = [f["src"] for f in report["figures"] if not f["caption"]]
    assert not uncaptioned, f"{page.name}: figures without a caption: {uncaptioned[:3]}"
    for w, seen in legible.items():
        problems = legibility_problems(seen)
        assert not problems, f"{page.name} at {w} px: figures that cannot be read: {problems[:4]}"
    assert not violations, f"{page.name}: axe-core finds WCAG 2.1 A/AA violations: " + "; ".join(
        f"{v['id']} ({v['impact']}, {v['count']} nodes, e.g. {v['nodes']}): {v['help']}" for v in violations)


def test_legibility_problems_are_found():
    """The measurements the browser reports, judged: a wide figure with small text, shrunk to the column."""
    fits = {"src": "a.png", "natural": 1140, "shown": 800, "text_px": 13.89, "frame": 816, "right": 1056}
    assert legibility_problems({"width": WIDTH, "figures": [fits]}) == []
    shrunk = dict(fits, natural=1300, text_px=11.11)  # 8-point text in a 13-inch figure: 6.8 px
    assert any("under" in p for p in legibility_problems({"width": WIDTH, "figures": [shrunk]}))
    wide = dict(fits, shown=1054, frame=816)  # legible only wider than the column
    assert any("the column has" in p for p in legibility_problems({"width": WIDTH, "figures": [wide]}))
    off = dict(fits, shown=739, frame=358, right=420)
    assert any("off the screen" in p for p in legibility_problems({"width": PHONE, "figures": [off]}))
    assert any("no text size" in p for p in legibility_problems({"width": PHONE, "figures": [dict(fits, text_px=None)]}))
