"""The book (make book) as a reader sees it: built once from made-up runs, opened in Chromium."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import nbformat
import pytest
from reference_runs import H100, write_reports

from coursetools import book, bookcheck, decision, headline
from coursetools.runner import course_notebooks

REPORT = headline.newest_run()  # the newest committed reference run: its executed notebooks
PHONE, DESKTOP = 390, 1280
GENERATOR = ("sphinx", "myst_nb", "sphinx_book_theme")


def test_a_run_without_answers_gets_one_line_on_the_landing_page(tmp_path):
    summary = {"gpu_name": "NVIDIA H200", "profile": "full"}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    page = book.landing_page(tmp_path, summary, {})
    assert headline.no_answers(tmp_path) in page and "<table" not in page


def test_build_leaves_a_folder_that_is_not_a_book_alone(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(SystemExit, match="not an earlier build of the book"):
        book.build(REPORT, out, settings={})
    assert (out / "notes.txt").read_text() == "keep me"


PAGE = """<html><head><title>T</title><link rel="stylesheet" href="_static/s.css"></head>
<body><section id="top"><img src="_images/plot.png"><a href="other.html#part">next</a>
<a href="https://example.org/">out</a><a href="#top">up</a>{extra}</section></body></html>"""


@pytest.mark.parametrize(("extra", "expected"), [
    ("", None),
    ('<img src="_images/gone.png">', "image '_images/gone.png' leads to no file"),
    ('<a href="missing.html">x</a>', "link 'missing.html' leads to no file"),
    ('<a href="other.html#nowhere">x</a>', "names an anchor that its page lacks"),
    ('<div class="cell_output docutils container"><div class="output traceback highlight-'
     'ipythontb notranslate"><pre>ZeroDivisionError</pre></div></div>', "shows an error output"),
    ('<div class="output stderr highlight-myst-ansi notranslate"><pre>warn</pre></div>',
     "shows a stderr output"),
    ('<div class="output stream"><pre>Traceback (most recent call last):\n  File</pre></div>',
     "shows a traceback"),
])
def test_checker_catches_what_a_reader_would_see_broken(tmp_path, extra, expected):
    for name in ("_static/s.css", "_images/plot.png"):
        (tmp_path / name).parent.mkdir()
        (tmp_path / name).write_text("x")
    (tmp_path / "other.html").write_text('<html><body><h2 id="part">x</h2></body></html>')
    (tmp_path / "page.html").write_text(PAGE.format(extra=extra))
    problems = bookcheck.site_problems(tmp_path)
    assert problems == [] if expected is None else len(problems) == 1 and expected in problems[0]


@pytest.fixture(scope="module")
def built(tmp_path_factory):  # an H100 (the newest run's notebooks) with a repeat, an A100
    if missing := [m for m in GENERATOR if importlib.util.find_spec(m) is None]:
        pytest.skip(f"the book's generator is missing ({', '.join(missing)}): "
                    "bash scripts/ensure_env.sh --for=book installs it")
    reports = write_reports(root := tmp_path_factory.mktemp("book"))
    for path in REPORT.glob("[0-9][0-9]_*.ipynb"):
        (reports / "h100" / path.name).symlink_to(path)
    assert headline.newest_run(reports) == reports / "h100"  # what make book shows by default
    return book.build(reports / "h100", root / "book", settings={}).parent


def _notebook_pages(site: Path) -> dict[str, Path]:
    return {p.name: site / f"{p.stem}.html" for p in sorted(REPORT.glob("[0-9][0-9]_*.ipynb"))}


@pytest.mark.slow
def test_every_notebook_has_a_page_whose_links_and_images_resolve(built):
    pages = _notebook_pages(built)
    assert sorted(pages) == [p.name for p in course_notebooks()]  # the newest run has them all
    assert bookcheck.site_problems(built) == []
    for name, page in pages.items():
        html = page.read_text()
        assert "<img" in html or name.startswith("01"), f"{name}: its plots are missing"
        assert H100 in html and "course commit" in html, f"{name}: no run stamp"
        assert "_downloads/" in html and name in html, f"{name}: no download link"
    assert "colab.research.google.com" not in "".join(
        p.read_text() for p in built.glob("*.html")), "no repo_url, so no Colab link"


def _verdicts(page: Path) -> list[str]:
    return re.findall(r'class="verdict">([^<]*)<', page.read_text())


@pytest.mark.slow
def test_landing_and_decision_pages_show_the_runs_answers(built):
    reports = built.parent / "reports"
    every = headline.answers(reports / "h100")
    table = headline.apex_answers(every)
    assert _verdicts(built / "index.html") == [*table["verdict"], *every["verdict"]]
    hrefs = {url for tag, url in bookcheck.parse((built / "index.html").read_text()).refs
             if tag == "a"}
    assert {"decision.html", *(p.name for p in _notebook_pages(built).values())} <= hrefs
    shown = re.findall(r'class="verdict">([^<]*)<', decision.feature_table(
        decision.runs(reports))["answers per GPU"].str.cat())
    assert _verdicts(built / "decision.html") == shown and len(shown) > len(table)


@pytest.mark.slow
def test_pages_fit_a_phone_and_show_every_verdict(built, tmp_path):
    if (program := bookcheck.find_chromium()) is None:
        pytest.skip(f"headless Chromium is missing: {bookcheck.INSTALL}")
    chromium = bookcheck.Chromium(program)
    answers = [built / "index.html", built / "decision.html"]
    pages = [*answers, *_notebook_pages(built).values()]
    wide = built / "wide-test.html"  # too wide on purpose, its verdicts off screen: seen?
    wide.write_text((built / "decision.html").read_text().replace(
        "<body", '<body><div style="width: 900px">too wide</div><span hidden', 1).replace(
        'class="cards"', 'style="display: block; overflow-x: auto; min-width: 2000px"'))
    try:
        seen = {width: chromium.layout_widths([*pages, wide], width, tmp_path)
                for width in (PHONE, DESKTOP)}
    finally:
        wide.unlink()
    wide = seen[PHONE]["wide-test.html"]  # the check sees what it should
    assert int(wide["scroll-width"]) > PHONE and int(wide["verdicts-off-screen"]) > 0
    for page in pages:
        got = seen[PHONE].get(page.name)
        assert got, f"{page.name} did not load in Chromium (or its script did not run)"
        assert got["title"] and got["title"] == bookcheck.parse(page.read_text()).title.strip()
        assert int(got["view-width"]) == PHONE
        assert int(got["scroll-width"]) <= PHONE, (
            f"{page.name} scrolls sideways on a {PHONE}-pixel phone: "
            f"{got['scroll-width']} pixels wide ({got.get('too-wide')})")
    for width in (PHONE, DESKTOP):
        for page in answers:
            got = seen[width][page.name]
            assert int(got["verdicts"]) == len(_verdicts(page)) > 0
            assert got["verdicts-off-screen"] == "0", f"{page.name} at {width} px"
    page = next(built.glob("05_*.html")).name  # make book takes the landing page's too
    shots = bookcheck.take_screenshots(built, {"notebook-05": page}, tmp_path / "shots", chromium)
    assert [p.name for p in shots] == ["notebook-05-desktop.png", "notebook-05-phone.png"]
    assert all(10_000 < p.stat().st_size < 300_000 for p in shots)  # not blank


@pytest.mark.slow
def test_an_error_output_in_an_executed_notebook_is_caught(built, tmp_path):
    (report := tmp_path / "report").mkdir()  # after the real book: Sphinx loaded once for both
    nbformat.write(nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# 01 - A notebook that failed"),
        nbformat.v4.new_code_cell("1 / 0", outputs=[nbformat.v4.new_output(
            "error", ename="ZeroDivisionError", evalue="division by zero",
            traceback=["Traceback (most recent call last):", "ZeroDivisionError"])])]),
        report / "01_failed.ipynb")
    (report / "summary.json").write_text(json.dumps({"gpu_name": "NVIDIA H200"}))
    problems = bookcheck.site_problems(book.build(report, tmp_path / "book", settings={}).parent)
    assert any("01_failed.html: shows an error output" in p for p in problems), problems
    assert any("traceback" in p for p in problems), problems
