"""The built book checked as a reader sees it (tests/test_book.py).

- ``page_problems`` / ``site_problems``: in the built HTML, every image and internal link
  resolves (the file, and the ``#anchor`` in it), and no page shows an error output, a
  stderr output or a traceback;
- ``Chromium``: the headless browser (Debian's ``chromium``) driven by its command line only:
  ``--dump-dom`` of a page, ``--screenshot`` of it, and the width a page lays out to on a phone
  (the book's ``measure.js`` writes it onto ``<html>`` when the URL has ``?measure``).
"""

from __future__ import annotations

import html
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

TRACEBACK = "Traceback (most recent call last)"
# myst-nb's classes of the outputs a reader must not see on a reference page
ERROR_CLASSES = {"traceback": "an error output", "stderr": "a stderr output"}
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
INSTALL = "apt-get install -y chromium"


class _Page(HTMLParser):
    """What a page links to, its anchors, and its outputs' classes and text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.refs: list[tuple[str, str]] = []  # (tag, url)
        self.ids: set[str] = set()
        self.errors: list[str] = []
        self.title = ""
        self._in_title = False
        self._output_depth: list[int] = []  # stack depths of the open output divs
        self._depth = 0
        self.output_text: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for key in ("id", "name"):
            if attrs.get(key) and (key == "id" or tag == "a"):
                self.ids.add(attrs[key])
        if tag == "img" and attrs.get("src") is not None:
            self.refs.append(("img", attrs["src"]))
        elif tag in ("a", "link") and attrs.get("href") is not None:
            self.refs.append((tag, attrs["href"]))
        elif tag == "script" and attrs.get("src"):
            self.refs.append(("script", attrs["src"]))
        elif tag == "title":
            self._in_title = True
        if tag in ("img", "link", "meta", "br", "hr", "input", "source", "wbr"):
            return  # void elements: no end tag follows
        self._depth += 1
        classes = set((attrs.get("class") or "").split())
        if tag == "div" and "output" in classes:
            self._output_depth.append(self._depth)
            for cls, what in ERROR_CLASSES.items():
                if cls in classes:
                    self.errors.append(what)

    def handle_endtag(self, tag):
        if tag == "title":
            self._in_title = False
        if tag in ("img", "link", "meta", "br", "hr", "input", "source", "wbr"):
            return
        if self._output_depth and self._output_depth[-1] == self._depth:
            self._output_depth.pop()
        self._depth -= 1

    def handle_data(self, data):
        if self._in_title:
            self.title += data
        if self._output_depth:
            self.output_text.append(data)


def parse(html: str) -> _Page:
    """The parsed page."""
    page = _Page()
    page.feed(html)
    page.close()
    return page


def _local(url: str) -> bool:
    parts = urlsplit(url)
    return not (parts.scheme or parts.netloc or url.startswith("//"))


def page_problems(path: Path, site: Path, pages: dict[Path, _Page] | None = None) -> list[str]:
    """What a reader of ``path`` (a page of the site in ``site``) would find broken: images
    and internal links that lead nowhere, error and stderr outputs, tracebacks."""
    pages = {} if pages is None else pages
    page = pages.get(path) or parse(path.read_text(errors="replace"))
    pages[path] = page
    where = path.relative_to(site)
    problems = [f"{where}: shows {what}" for what in page.errors]
    if TRACEBACK in "".join(page.output_text) or TRACEBACK in path.read_text(errors="replace"):
        problems.append(f"{where}: shows a traceback ('{TRACEBACK}')")
    for tag, url in page.refs:
        if not _local(url) or url.startswith(("mailto:", "javascript:", "data:")):
            continue
        parts = urlsplit(url)
        target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
        what = "image" if tag == "img" else "link"
        if not target.is_file() and not (target.is_dir() and (target / "index.html").is_file()):
            problems.append(f"{where}: {what} '{url}' leads to no file")
            continue
        if parts.fragment and target.suffix == ".html":
            other = pages.get(target)
            if other is None:
                other = pages[target] = parse(target.read_text(errors="replace"))
            if unquote(parts.fragment) not in other.ids:
                problems.append(f"{where}: link '{url}' names an anchor that its page lacks")
    return problems


def site_problems(site: Path) -> list[str]:
    """:func:`page_problems` for every page of the site (not the theme's templates in _static)."""
    pages: dict[Path, _Page] = {}
    return [p for path in sorted(site.rglob("*.html")) if "_static" not in path.parts
            for p in page_problems(path, site, pages)]


def find_chromium() -> str | None:
    """The headless browser's program, or None when none is installed."""
    return next((found for name in CHROMIUM_NAMES if (found := shutil.which(name))), None)


class Chromium:
    """Headless Chromium through its command line: no driver, no protocol client."""

    def __init__(self, program: str, timeout: float = 60.0) -> None:
        self.program, self.timeout = program, timeout

    def _run(self, url: str, width: int, height: int, *extra: str) -> subprocess.CompletedProcess:
        with tempfile.TemporaryDirectory(prefix="chromium-") as profile:  # one per run
            args = [self.program, "--headless", "--no-sandbox", "--disable-gpu",
                    "--disable-dev-shm-usage", "--no-first-run", "--hide-scrollbars",
                    f"--user-data-dir={profile}", "--allow-file-access-from-files",
                    "--run-all-compositor-stages-before-draw", "--virtual-time-budget=4000",
                    f"--window-size={width},{height}", *extra, url]
            return subprocess.run(args, capture_output=True, text=True, timeout=self.timeout)

    def dump_dom(self, url: str, width: int = 1280, height: int = 900) -> str:
        """The page's DOM after its scripts ran, as HTML ('' when the browser failed)."""
        return self._run(url, width, height, "--dump-dom").stdout

    def screenshot(self, url: str, out: Path, width: int, height: int) -> Path:
        """A PNG of the page's first ``height`` pixels at ``width``."""
        out.parent.mkdir(parents=True, exist_ok=True)
        proc = self._run(url, width, height, f"--screenshot={out}")
        if not out.is_file():
            raise RuntimeError(f"chromium wrote no screenshot of {url}: {proc.stderr[-500:]}")
        return out

    def layout_widths(self, pages: list[Path], width: int, scratch: Path) -> dict[str, dict]:
        """What each page reports once loaded in a ``width``-pixel frame (the book's
        ``measure.js``: its title and the widths it lays out to), by file name; a page that
        did not load or whose script did not run is absent. All pages in one browser run: a
        frame page written to ``scratch`` holds each in an <iframe> of that width (headless
        Chromium lays out ``--dump-dom`` at 500 pixels at least) and writes what they report
        into its own DOM. The pages missing from that run get a second one (on a busy machine,
        a page can report after the browser's time budget)."""
        scratch.mkdir(parents=True, exist_ok=True)
        frame, found = scratch / f"frames-{width}.html", {}
        for _ in range(2):
            frames = "\n".join(f'<iframe src="{p.resolve().as_uri()}?measure" width="{width}" '
                                'height="600"></iframe>' for p in pages if p.name not in found)
            frame.write_text(FRAME.format(frames=frames))
            dom = self.dump_dom(frame.as_uri(), max(width, 500) + 40, 900)
            for attrs in re.findall(r"<p class=\"measured\"([^>]*)>", dom):
                values = {k: html.unescape(v) for k, v in re.findall(r'data-([a-z-]+)="([^"]*)"',
                                                                      attrs)}
                found[values.get("page", "")] = values
            if all(p.name in found for p in pages):
                break
        return found


SCREENS = {"desktop": (1280, 900), "phone": (390, 844)}


def take_screenshots(site: Path, pages: dict[str, str], out: Path,
                     chromium: Chromium) -> list[Path]:
    """PNGs of ``pages`` (a short name -> the page's file in ``site``) at each of ``SCREENS``,
    into ``out`` as ``<name>-<screen>.png``, reduced to a 256-colour palette (a page of text
    and plots keeps its look at a fraction of the size)."""
    from PIL import Image

    def shoot(name: str, page: str, screen: str) -> Path:
        width, height = SCREENS[screen]
        path = chromium.screenshot((site / page).resolve().as_uri(),
                                   out / f"{name}-{screen}.png", width, height)
        with Image.open(path) as image:
            small = image.convert("RGB").quantize(colors=256)
        small.save(path, optimize=True)
        return path

    # side by side: a browser run mostly waits (start-up, shutdown), on one core or two
    jobs = [(name, page, screen) for name, page in pages.items() for screen in SCREENS]
    with ThreadPoolExecutor(max_workers=len(jobs) or 1) as pool:
        return list(pool.map(lambda job: shoot(*job), jobs))


FRAME = """<!DOCTYPE html>
<html><head><meta charset="utf-8">
<style>body {{ margin: 0; }} iframe {{ display: block; border: 0; }}</style></head><body>
{frames}
<script>
window.addEventListener("message", function (event) {{
  var p = document.createElement("p");
  p.className = "measured";
  Object.keys(event.data).forEach(function (key) {{
    p.setAttribute("data-" + key, event.data[key]);
  }});
  document.body.appendChild(p);
}});
</script></body></html>
"""
