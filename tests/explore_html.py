#!/usr/bin/env python3
"""The `aim explore --html` page in a real browser (headless Chromium, no network).

Usage: explore_html.py AIM_BINARY MODEL.onnx OUT_DIR [--profile TRACE.json]

Writes the page for MODEL, opens it in Chromium driven over the DevTools protocol (through
--remote-debugging-pipe: no port, no extra Python package), moves the mouse over a line of a
fused node in the optimised-IR pane, and checks that every line of the same source nodes is
highlighted in every pane showing them — and nothing else — and that the side panel shows
the node's figures. Then types in the search box, and saves a screenshot to
OUT_DIR/explore.png. Exits 1 on any failure. Needs Debian's chromium package.
"""
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-extensions", "--window-size=1600,900", "--remote-debugging-pipe",
]


class Browser:
    """Chromium with the DevTools protocol on file descriptors 3 (commands) and 4 (replies)."""

    def __init__(self, exe):
        self.profile = tempfile.mkdtemp(prefix="aim-chromium-")
        cmd_r, self.cmd_w = os.pipe()
        self.resp_r, resp_w = os.pipe()

        # The child must see the command pipe as fd 3 and the reply pipe as fd 4. Move both
        # to high numbers first, so that placing one cannot overwrite the other.
        cmd_hi, resp_hi = os.dup(cmd_r), os.dup(resp_w)
        os.close(cmd_r)
        os.close(resp_w)
        cmd_r, resp_w = cmd_hi, resp_hi

        def child_fds():
            os.dup2(cmd_r, 3)
            os.dup2(resp_w, 4)
            os.set_inheritable(3, True)
            os.set_inheritable(4, True)

        self.proc = subprocess.Popen(
            [exe, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            close_fds=False, preexec_fn=child_fds,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL if not os.environ.get('AIM_CHROMIUM_LOG') else None,
        )
        os.close(cmd_r)
        os.close(resp_w)
        self.buf = b""
        self.next_id = 0
        self.events = []
        self.session = None

    def _read_message(self, deadline):
        while b"\0" not in self.buf:
            if time.time() > deadline:
                raise TimeoutError("no reply from Chromium")
            chunk = os.read(self.resp_r, 1 << 16)
            if not chunk:
                raise RuntimeError("Chromium closed the DevTools pipe")
            self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def send(self, method, params=None, timeout=30):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if self.session:
            msg["sessionId"] = self.session
        os.write(self.cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.time() + timeout
        while True:
            m = self._read_message(deadline)
            if m.get("id") == self.next_id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m.get("result", {})
            self.events.append(m)

    def wait_event(self, method, timeout=30):
        deadline = time.time() + timeout
        while True:
            for i, e in enumerate(self.events):
                if e.get("method") == method:
                    return self.events.pop(i)
            self.events.append(self._read_message(deadline))

    def eval(self, js):
        r = self.send("Runtime.evaluate", {"expression": js, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in r:
            raise RuntimeError(f"page script failed: {r['exceptionDetails']}")
        return r["result"].get("value")

    def close(self):
        try:
            self.session = None
            self.send("Browser.close", timeout=5)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.profile, ignore_errors=True)


def main():
    args = sys.argv[1:]
    profile = None
    if "--profile" in args:
        i = args.index("--profile")
        profile = args[i + 1]
        del args[i:i + 2]
    if len(args) != 3:
        sys.exit(__doc__)
    aim, model, out_dir = args
    os.makedirs(out_dir, exist_ok=True)
    page = os.path.abspath(os.path.join(out_dir, "explore.html"))
    cmd = [aim, "explore", model, "--html", page] + (["--profile", profile] if profile else [])
    subprocess.run(cmd, check=True)
    size = os.path.getsize(page)
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if not exe:
        sys.exit("explore_html: chromium not found (apt-get install chromium)")
    b = Browser(exe)
    failures = []
    try:
        targets = b.send("Target.getTargets")["targetInfos"]
        tid = next(t["targetId"] for t in targets if t["type"] == "page")
        b.session = b.send("Target.attachToTarget", {"targetId": tid, "flatten": True})["sessionId"]
        b.send("Page.enable")
        b.send("Page.navigate", {"url": "file://" + page})
        b.wait_event("Page.loadEventFired")
        # A line of a fused node (several sources) in the optimised-IR pane.
        target = b.eval("""(() => {
            const el = [...document.querySelectorAll('.pane[data-stage="optimized"] .l.src')]
                .find(e => e.dataset.s.split(' ').length > 1);
            if (!el) return null;
            el.scrollIntoView({block: 'center'});
            const r = el.getBoundingClientRect();
            return {x: r.left + 20, y: r.top + r.height / 2, s: el.dataset.s, text: el.textContent,
                    names: el.title};
        })()""")
        if not target:
            raise RuntimeError("no fused line in the optimised pane")
        b.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": target["x"], "y": target["y"]})
        state = b.eval("""(() => {
            const hl = [...document.querySelectorAll('.l.hl')];
            const byPane = {};
            for (const e of hl) {
                const p = e.closest('.pane').dataset.stage;
                byPane[p] = (byPane[p] || 0) + 1;
            }
            return {byPane, sources: hl.map(e => e.dataset.s || ''), info: document.getElementById('info').innerText};
        })()""")
        hovered = set(target["s"].split())
        if not state["byPane"]:
            failures.append("hovering highlighted nothing")
        for s in state["sources"]:
            if not hovered & set(s.split()):
                failures.append(f"a highlighted line shares no source with the hovered one: {s}")
                break
        for pane in ("onnx", "optimized", "scheduled"):
            if state["byPane"].get(pane, 0) == 0:
                failures.append(f"nothing highlighted in the {pane} pane")
        if "FLOPs" not in state["info"]:
            failures.append("the side panel does not show the node's figures")
        # The search box marks matching lines.
        matches = b.eval("""(() => {
            const s = document.getElementById('search');
            s.value = 'aim:Conv';
            s.dispatchEvent(new Event('input'));
            return document.querySelectorAll('.l.match').length;
        })()""")
        if not matches:
            failures.append("searching for aim:Conv marked no line")
        b.eval("(() => { const s = document.getElementById('search'); s.value = ''; s.dispatchEvent(new Event('input')); })()")
        b.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": target["x"], "y": target["y"]})
        shot = b.send("Page.captureScreenshot", {"format": "png"})["data"]
        png = os.path.join(out_dir, "explore.png")
        with open(png, "wb") as f:
            f.write(base64.b64decode(shot))
        print(f"explore_html: page {page} ({size} bytes); hovered {target['names']!r}: "
              f"highlighted lines by pane {state['byPane']}; search 'aim:Conv' marked {matches} lines; "
              f"screenshot {png}")
    except Exception as e:  # noqa: BLE001 - any failure of the browser test is a failure
        failures.append(f"{type(e).__name__}: {e}")
    finally:
        b.close()
    for f in failures:
        print("explore_html: FAIL:", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
