"""A screenshot of a page of the trace UI (a JavaScript app) with headless Chromium, for docs/img/.

    .venv-trace-ui/bin/python deploy/trace_screenshot.py URL OUT.png [--tab Attributes] [--wait-for TEXT]

Phoenix renders after its GraphQL queries return, which on a loaded machine takes minutes, so
Chromium's own --screenshot (a fixed virtual-time budget) catches a skeleton. This drives Chromium
over the DevTools protocol instead: load, wait until TEXT is on the page, click the tab named
--tab (a real mouse event), capture. Needs `chromium` (Debian's package) and `websockets`
(in Phoenix's venv). How docs/img/trace.png was taken:

    .venv-trace-ui/bin/python deploy/trace_screenshot.py \\
        http://127.0.0.1:6006/projects/UHJvamVjdDoy/traces/<trace id> docs/img/trace.png --tab Attributes
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import subprocess
import tempfile
import time
import urllib.request

import websockets

PORT = 9333
FIND_TAB = ("(() => { const rs = [...document.querySelectorAll('*')]"
            ".filter(e => e.children.length === 0 && e.textContent.trim() === %r)"
            ".map(e => e.getBoundingClientRect()).filter(r => r.width > 0 && r.x > 600).sort((a, b) => a.y - b.y);"
            " return rs.length ? [rs[0].x + rs[0].width / 2, rs[0].y + rs[0].height / 2] : null; })()")  # fmt: skip


class Page:
    def __init__(self, ws) -> None:
        self.ws, self.n = ws, 0

    async def call(self, method: str, **params) -> dict:
        self.n += 1
        await self.ws.send(json.dumps({"id": self.n, "method": method, "params": params}))
        while (msg := json.loads(await self.ws.recv())).get("id") != self.n:
            pass
        return msg.get("result", {})

    async def value(self, expression: str):
        return (await self.call("Runtime.evaluate", expression=expression, returnByValue=True))["result"].get("value")


async def capture(ws_url: str, args) -> bytes:
    async with websockets.connect(ws_url, max_size=1 << 26) as ws:
        page = Page(ws)
        deadline = time.monotonic() + args.timeout
        while not await page.value(f"document.body.innerText.includes({json.dumps(args.wait_for)})"):
            if time.monotonic() > deadline:
                raise SystemExit(f"{args.wait_for!r} never showed on {args.url}")
            await asyncio.sleep(2)
        await asyncio.sleep(3)
        if args.tab:
            while (point := await page.value(FIND_TAB % args.tab)) is None:  # the span's panel renders last
                if time.monotonic() > deadline:
                    raise SystemExit(f"no tab {args.tab!r} on the page")
                await asyncio.sleep(2)
            x, y = point
            for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
                await page.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)
            await asyncio.sleep(6)
        return base64.b64decode((await page.call("Page.captureScreenshot", format="png"))["data"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("url")
    parser.add_argument("out")
    parser.add_argument("--tab", help="click this tab before the capture (e.g. Attributes)")
    parser.add_argument("--wait-for", default="tandem.v1.TargetService/Verify", help="text that means rendered")
    parser.add_argument("--size", default="1600x1300")
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as profile:
        chromium = subprocess.Popen(
            ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             f"--window-size={args.size.replace('x', ',')}", f"--remote-debugging-port={PORT}",
             f"--user-data-dir={profile}", args.url],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            for _ in range(120):
                try:
                    tabs = json.load(urllib.request.urlopen(f"http://127.0.0.1:{PORT}/json"))
                    ws_url = next(t["webSocketDebuggerUrl"] for t in tabs if t["type"] == "page")
                    break
                except (OSError, StopIteration, ValueError):
                    time.sleep(0.5)
            else:
                raise SystemExit("chromium did not start")
            with open(args.out, "wb") as f:
                f.write(asyncio.run(capture(ws_url, args)))
            print(f"wrote {args.out}")
        finally:
            chromium.terminate()
            chromium.wait(timeout=30)


if __name__ == "__main__":
    main()
