"""Instructor mode: slide metadata, the static decks measured slide by slide in headless
Chromium, the live RISE deck in JupyterLab, and the PDF handout.

The rules every lesson deck follows (lessons 01 to 04, and any `notebooks/0N_*.ipynb`
added later: tools/build_slides.py picks it up), each checked below:

1. Every cell has `metadata.slideshow.slide_type`: `slide`, `subslide`, `fragment`, `-`
   (stays on the slide above), `notes` (speaker notes) or `skip` (not in the deck). The
   title cell is a `slide`; the first code cell (imports, settings) is `skip`, and so is
   other bookkeeping code (a helper the slide does not discuss). A skipped cell still
   runs in the notebook.
2. A slide fits a 1280 x 720 screen (a 16:9 projector): in the static deck, reveal.js's
   slide box is 1280 x 720 CSS px (drawn at 96 % of the window) and a slide's content is
   no taller. About 25 lines of code or printed text fit under a title, or a figure and
   5 lines. A long section becomes sub-slides (`subslide`; a long Markdown cell is split
   where its topic changes) or fragments; a measuring cell whose code is long but whose
   result is the point keeps its code in the notebook and shows only its output on the
   slide (cell tag `slide-output-only`).
3. A slide that must scroll says why, on the cell that opens it:
   `"slideshow": {"slide_type": "subslide", "scrolls": "<why>"}`. At most 10 % of all
   the slides, and none taller than two screens (1440 px).
4. Nothing is cut at the right edge: the decks wrap a line rather than cut it, code
   lines are at most 88 characters so that they never wrap, and a printed table (columns
   separated by " | ") fits the slide's width unwrapped (about 105 characters); other
   printed text may wrap.
5. A figure is at least 60 % of the slide's width (unless two sit side by side in one
   output); tools/build_slides.py sizes the figures.
6. The notebook's metadata has `"rise": {"scroll": true, "theme": "white"}`: the live
   deck (RISE) takes the static decks' theme, and scrolls a slide too long for the
   window instead of cutting it.
7. The practice notebooks are not decks: no `slide`, `subslide` or `fragment` in them.
"""
import base64
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter

import pytest
from chromium import Chromium, find_chromium
from tool_scripts import load_tool

from helpers.paths import REPO_ROOT

build_slides, handout = load_tool("build_slides"), load_tool("handout")
LESSONS, SLIDES_DIR = build_slides.LESSONS, build_slides.SLIDES_DIR
PRACTICE = sorted((REPO_ROOT / "notebooks" / "practice").glob("*.ipynb"))
SLIDE_TYPES = {"slide", "subslide", "fragment", "skip", "notes", "-"}
MAX_LINE = 88  # characters of a code line (rule 4)
MAX_SCROLLING_SHARE = 0.10  # of all slides, at most (rule 3)
# a slide that scrolls is at most this many screens tall (rule 3)
MAX_SCROLLING_SCREENS = 2
MIN_FIGURE_WIDTH = 0.60  # of the slide's width (rule 5)


def slide_type(cell):
    return cell.get("metadata", {}).get("slideshow", {}).get("slide_type")


def slide_openers(notebook):
    """The cells that open each slide of the deck, in order (as nbconvert's reveal
    exporter nests them)."""
    cells = notebook["cells"]
    first = next(
        i for i, cell in enumerate(cells) if slide_type(cell) not in {"notes", "skip"}
    )
    return [cells[first]] + [
        cell for cell in cells[first + 1 :] if slide_type(cell) in {"slide", "subslide"}
    ]


def source_lines(cell):
    return "".join(cell["source"]).splitlines()


# --- The metadata, read from the notebooks
# -------------------------------------------------------

@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_every_cell_has_slide_metadata(lesson, read_notebook):
    types = [slide_type(cell) for cell in read_notebook(lesson)["cells"]]
    assert set(types) <= SLIDE_TYPES, ("unknown or missing slide types: "
                                       f"{set(types) - SLIDE_TYPES}")
    assert types[0] == "slide", "the title cell opens the deck"
    counts = Counter(types)
    assert counts["fragment"] >= 1 and counts["notes"] >= 1 and counts["skip"] >= 1


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_set_up_code_is_skipped(lesson, read_notebook):
    first_code = next(
        cell for cell in read_notebook(lesson)["cells"] if cell["cell_type"] == "code"
    )
    assert slide_type(first_code) == "skip"


def test_the_a_plus_b_bullets_are_revealed_one_at_a_time(read_notebook):
    # each bullet of the slide's A, B and C example is a fragment, or opens a sub-slide
    # of its own (its measurement comes with it, and a slide holds only so much code)
    lesson = next(p for p in LESSONS if p.stem.startswith("01_"))
    bullets = ["**Compute C from A and B", "**A and B are not needed",
               "**Should we keep A and B",
               "**Without checkpointing", "**With checkpointing", "**If recomputing B "
                                                                  "is expensive"]
    sources = {"".join(cell["source"]): slide_type(cell)
               for cell in read_notebook(lesson)["cells"]}
    for bullet in bullets:
        matching = [
            kind for source, kind in sources.items() if source.startswith(bullet)
        ]
        assert len(matching) == 1 and matching[0] in {"fragment", "subslide"}, bullet


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_code_lines_are_short_enough_for_a_slide(lesson, read_notebook):
    long_lines = [f"cell {index} ({len(line)}): {line}"
                  for index, cell in enumerate(read_notebook(lesson)["cells"])
                  if cell["cell_type"] == "code" for line in source_lines(cell)
                  if len(line) > MAX_LINE]
    assert not long_lines, f"code lines over {MAX_LINE} characters:\n" + "\n".join(
        long_lines
    )


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_the_live_deck_uses_the_static_decks_theme_and_scrolls_a_long_slide(
    lesson, read_notebook
):
    assert read_notebook(lesson)["metadata"].get("rise") == {"scroll": True,
                                                             "theme": "white"}


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_a_scrolling_slide_says_why(lesson, read_notebook):
    notebook = read_notebook(lesson)
    openers = [id(cell) for cell in slide_openers(notebook)]
    for index, cell in enumerate(notebook["cells"]):
        reason = cell.get("metadata", {}).get("slideshow", {}).get("scrolls")
        if reason is not None:
            assert id(cell) in openers, (f"cell {index}: `scrolls` belongs on the "
                                         "cell that opens a slide")
            assert isinstance(reason, str) and len(reason.split()) >= 4, (
                f"cell {index}: say why it scrolls"
            )


UNDER_THE_HOOD = re.compile(r"<details><summary>Under the hood: "
                            r"[^<]+</summary>\n\n.+\n</details>", re.S)


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_under_the_hood_blocks_are_collapsed_speaker_notes(lesson, read_notebook):
    # STYLE.md rule 15: a notes cell, collapsed in JupyterLab (no `open`), a blank line
    # after the summary so that JupyterLab renders the Markdown inside; the decks open
    # it (build_slides)
    for index, cell in enumerate(read_notebook(lesson)["cells"]):
        source = "".join(cell["source"])
        if "<details" in source:
            assert slide_type(cell) == "notes", (f"cell {index}: an Under the hood "
                                                 "block is a notes cell")
            assert UNDER_THE_HOOD.fullmatch(source.strip()), (f"cell {index}: "
                                                              f"{source[:80]!r}")


READABILITY = REPO_ROOT.parent / "shared" / "tools" / "readability.py"
# on the learner's path (issues 26, 27, 28; lesson 00 from issue 42)
ON_THE_LEARNERS_PATH = ["00", "01", "02", "03", "04", "05", "06", "07"]


def test_lessons_on_the_learners_path_meet_the_readability_goals():
    # STYLE.md rules 14-18, measured by the shared tool: screens, words per screen, no
    # source paths or private names on slides, short markdown cells, each concept slide
    # showing its figure
    if not READABILITY.exists():
        pytest.skip(f"{READABILITY} is not beside the repository (CI and developers "
                    "have ../shared)")
    result = subprocess.run(
        [sys.executable, str(READABILITY), "--check", *ON_THE_LEARNERS_PATH],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_practice_notebooks_are_not_decks(read_notebook):
    assert PRACTICE and not set(PRACTICE) & set(LESSONS)
    for path in PRACTICE:
        types = {slide_type(cell) for cell in read_notebook(path)["cells"]}
        assert not types & {"slide", "subslide", "fragment"}, path.name


# --- The static decks
# ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def decks():
    SLIDES_DIR.mkdir(parents=True, exist_ok=True)
    if shutil.which("npm") is None and not (SLIDES_DIR / "reveal.js").exists():
        pytest.skip("npm is needed once to fetch reveal.js for the offline decks")
    build_slides.install_assets()
    # every deck rendered once, by one nbconvert
    return dict(zip(LESSONS, build_slides.render(*LESSONS)))


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_each_lesson_renders_with_the_expected_number_of_slides(
    decks, lesson, read_notebook
):
    html = decks[lesson].read_text()
    counts = Counter(slide_type(cell) for cell in read_notebook(lesson)["cells"])
    # nbconvert nests a section per subslide inside a section per slide
    assert html.count("<section") == 2 * counts["slide"] + counts["subslide"]
    # figures embedded: no kernel, no files needed
    assert "data:image/png;base64" in html
    # Under the hood blocks are open in the speaker notes
    assert "<details>" not in html
    # nothing fetched
    assert not re.search(r"""(src|href)=["']https?://|from ["']https?://""", html)


def test_rise_extension_is_installed_and_enabled():
    listing = subprocess.run([sys.executable, "-m", "jupyter", "labextension", "list"],
                             capture_output=True, text=True)
    text = re.sub(r"\x1b\[[0-9;]*m", "", listing.stdout + listing.stderr)
    assert re.search(r"jupyterlab-rise v[\d.]+ enabled\s+OK", text), text


@pytest.fixture(scope="module")
def browser():
    if find_chromium() is None:
        pytest.skip("Chromium is not installed (Debian: apt-get install chromium); "
                    "the deck tests need a browser")
    # one browser for every deck, the live deck and the handouts
    with Chromium() as page:
        yield page


TITLE_CHECK = """(() => {
  const title = document.querySelector('.reveal .slides section.present h1');
  if (!title) return null;
  const box = title.getBoundingClientRect(), style = getComputedStyle(title);
  return {text: title.innerText,
          visible: box.width > 0 && box.height > 0 && box.top < innerHeight
                   && box.bottom > 0 && style.visibility !== 'hidden'
                   && style.display !== 'none'};
})()"""

# Every slide shown in turn (no transition), measured in CSS px of the slide (scale 1)
# and on the screen.
MEASURE_SLIDES = """(() => {
  // the decks load reveal.js with RequireJS
  const Reveal = require('reveal.js/dist/reveal.js');
  Reveal.configure({transition: 'none', backgroundTransition: 'none'});
  const scale = Reveal.getScale(), config = Reveal.getConfig(), slides = [];
  const blocks = ('pre, table, .jp-OutputArea-output, .jp-InputArea-editor, '
                  + '.jp-RenderedHTMLCommon');
  const ruler = document.createElement('canvas').getContext('2d');
  const widest = text => text.split('\\n')
    .reduce((a, b) => (b.length > a.length ? b : a), '').trim();
  Reveal.getHorizontalSlides().forEach((horizontal, h) => {
    const stack = Array.from(horizontal.querySelectorAll(':scope > section'));
    (stack.length ? stack : [horizontal]).forEach((slide, v) => {
      Reveal.slide(h, v);
      const frame = slide.getBoundingClientRect();
      const heading = slide.querySelector('h1, h2, h3');
      const cut = [], figures = [];
      for (const element of slide.querySelectorAll(blocks)) {
        if (element.closest('aside.notes')) continue;
        const box = element.getBoundingClientRect();
        if (box.width === 0) continue;
        // text hidden inside its block (clipped, or behind a scroll bar), or the
        // block past the slide's edge
        const hidden = (element.tagName === 'PRE'
                        ? element.scrollWidth - element.clientWidth : 0);
        const beyond = (box.right - frame.right) / scale;
        if (Math.max(hidden, beyond) > 1)
          cut.push({by: Math.round(Math.max(hidden, beyond)),
                    text: widest(element.textContent).slice(0, 100)});
      }
      // on the screen: what the audience sees of the slide
      let top = Infinity, bottom = -Infinity;
      for (const child of slide.children) {
        const box = child.getBoundingClientRect();
        if (child.tagName === 'ASIDE' || box.height === 0) continue;
        top = Math.min(top, box.top);
        bottom = Math.max(bottom, box.bottom);
      }
      // lines of code or printed text too long for their block's width
      const wrapped = [];
      for (const pre of slide.querySelectorAll('pre')) {
        if (pre.closest('aside.notes') || pre.getBoundingClientRect().width === 0)
          continue;
        const style = getComputedStyle(pre);
        ruler.font = `${style.fontWeight} ${style.fontSize} ${style.fontFamily}`;
        const room = (pre.clientWidth - parseFloat(style.paddingLeft)
                      - parseFloat(style.paddingRight));
        const kind = pre.closest('.jp-InputArea') ? 'code' : 'printed';
        for (const line of pre.textContent.split('\\n'))
          if (ruler.measureText(line).width > room + 0.5)
            wrapped.push({kind, text: line.slice(0, 120)});
      }
      for (const image of slide.querySelectorAll('img')) {
        if (image.closest('aside.notes')) continue;
        const output = image.closest('.jp-OutputArea') || image.parentElement;
        figures.push({share: image.getBoundingClientRect().width / frame.width,
                      beside: output.querySelectorAll('img').length - 1});
      }
      slides.push({h, v,
                   title: (heading || slide).innerText.trim().split('\\n')[0]
                          .slice(0, 70),
                   height: slide.scrollHeight,
                   screen_height: Math.round(slide.scrollHeight * scale),
                   top: Math.round(top), bottom: Math.round(bottom),
                   // turned into a scroll box (nbconvert's reveal_scroll): the rest is
                   // hidden below
                   scroll_box: getComputedStyle(slide).overflowY !== 'visible'
                               && slide.scrollHeight > slide.clientHeight + 1,
                   cut, wrapped, figures});
    });
  });
  Reveal.slide(0, 0);
  return {scale, box: {width: config.width, height: config.height},
          window: [innerWidth, innerHeight], slides};
})()"""


@pytest.fixture(scope="module")
def measured(decks, browser, read_notebook):
    """Each deck opened at 1280 x 720: its title slide, every slide measured, and the
    page's errors.

    The figures also land in build/slides/fit.json, and a screenshot of each title slide
    beside it.
    """
    results = {}
    for lesson, deck in decks.items():
        browser.events.clear()
        browser.open(deck.as_uri(), ready="!!document.querySelector('.reveal.ready')")
        title = browser.evaluate(TITLE_CHECK)
        screenshot = browser.call("Page.captureScreenshot", format="png")["data"]
        (SLIDES_DIR / f"{lesson.stem}.title.png").write_bytes(
            base64.b64decode(screenshot)
        )
        fit = browser.evaluate(MEASURE_SLIDES)
        openers = slide_openers(read_notebook(lesson))
        assert len(openers) == len(fit["slides"]), "one opening cell per slide"
        for slide, cell in zip(fit["slides"], openers):
            slide["scrolls"] = (
                cell.get("metadata", {}).get("slideshow", {}).get("scrolls")
            )
        results[lesson] = {"title": title, "errors": browser.errors(), **fit}
    (SLIDES_DIR / "fit.json").write_text(
        json.dumps({p.stem: r for p, r in results.items()}, indent=1)
    )
    return results


def describe(slide):
    return f"slide {slide['h']}.{slide['v']} {slide['title']!r}"


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_deck_opens_in_a_browser_with_a_visible_title_and_no_script_errors(
    measured, lesson, read_notebook
):
    title = measured[lesson]["title"]
    assert title is not None, "reveal.js did not start, or the first slide has no title"
    heading = ("".join(read_notebook(lesson)["cells"][0]["source"]) .splitlines()[0]
               .lstrip("# "))
    # the rendered text has no Markdown emphasis (lesson 00's title is in italics)
    heading = re.sub(r"[*_`]", "", heading)
    assert title["visible"] and title["text"].lower() == heading.lower(), title
    # page errors while loading and while visiting every slide
    assert measured[lesson]["errors"] == []


def test_the_decks_are_laid_out_for_a_16_by_9_screen(measured):
    for fit in measured.values():
        assert fit["window"] == [1280, 720]
        assert fit["box"]["width"] * 9 == fit["box"]["height"] * 16, fit["box"]


def height_problems(fit):
    """What is wrong with the heights of one deck's measured slides (rules 2 and 3), in
    words."""
    screen_height, box_height = fit["window"][1], fit["box"]["height"]
    too_tall = [slide for slide in fit["slides"] if slide["height"] > box_height
                or slide["top"] < 0 or slide["bottom"] > screen_height
                or slide["scroll_box"]]
    problems = [f"{describe(s)}: {s['screen_height']} px, shown from {s['top']} to "
                f"{s['bottom']} px on a "
                f"{screen_height} px screen{', in a scroll box' * s['scroll_box']}: "
                "split it, or say why it scrolls"
                for s in too_tall if not s["scrolls"]]
    problems += [f"{describe(s)} fits now: remove its `scrolls` reason"
                 for s in fit["slides"] if s["scrolls"] and s not in too_tall]
    problems += [f"{describe(s)}: {s['screen_height']} px, over "
                 f"{MAX_SCROLLING_SCREENS} screens even with a reason"
                 for s in too_tall if s["height"] > MAX_SCROLLING_SCREENS * box_height]
    return problems


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_every_slide_fits_the_screen_or_says_why_it_scrolls(measured, lesson):
    problems = height_problems(measured[lesson])
    assert not problems, "\n".join(problems)


def test_the_height_rules_catch_what_they_should():
    def slide(height, scrolls=None, **shown):
        return {"h": 1, "v": 0, "title": "t", "height": height,
                "screen_height": round(height * 0.96), "top": shown.get("top", 10),
                "bottom": shown.get("bottom", 10 + round(height * 0.96)),
                "scroll_box": shown.get("scroll_box", False), "scrolls": scrolls}
    def problems(*slides):
        return height_problems(
            {"window": [1280, 720], "box": {"width": 1280, "height": 720},
             "slides": slides}
        )
    reason = "a table the audience reads row by row"
    assert problems(slide(700)) == []
    assert problems(slide(1000, scrolls=reason)) == []
    assert "say why it scrolls" in problems(slide(721))[0]
    # nbconvert's scroll box
    assert "say why it scrolls" in problems(slide(700, scroll_box=True))[0]
    # shifted down, cut
    assert "say why it scrolls" in problems(slide(700, bottom=725))[0]
    assert "remove its `scrolls` reason" in problems(slide(700, scrolls=reason))[0]
    assert "over 2 screens" in problems(slide(1441, scrolls=reason))[0]


def test_few_slides_scroll(measured):
    slides = [slide for fit in measured.values() for slide in fit["slides"]]
    scrolling = [describe(slide) for slide in slides if slide["scrolls"]]
    assert len(scrolling) <= MAX_SCROLLING_SHARE * len(slides), scrolling


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_no_code_or_output_is_cut_at_the_right_edge(measured, lesson):
    cut = [f"{describe(slide)}: {block['by']} px hidden: {block['text']!r}"
           for slide in measured[lesson]["slides"] for block in slide["cut"]]
    assert not cut, "blocks wider than their slide:\n" + "\n".join(cut)


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_no_code_line_and_no_printed_table_row_wraps(measured, lesson):
    # code and printed text wrap rather than run off the slide; a code line of at most
    # 88 characters, or a row of a printed table (columns separated by " | "), must not
    # need to
    wrapped = [f"{describe(slide)}: {line['kind']}: {line['text']!r}"
               for slide in measured[lesson]["slides"] for line in slide["wrapped"]
               if line["kind"] == "code" or " | " in line["text"]]
    assert not wrapped, "lines wrapped on their slide:\n" + "\n".join(wrapped)


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_figures_are_big_enough_to_read_from_the_back_of_the_room(measured, lesson):
    small = [f"{describe(slide)}: {figure['share']:.0%} of the slide's width"
             for slide in measured[lesson]["slides"] for figure in slide["figures"]
             if figure["share"] < MIN_FIGURE_WIDTH and not figure["beside"]]
    assert not small, small


# --- The PDF handout
# ------------------------------------------------------------------------------

def test_the_handout_has_one_page_per_slide_with_the_speaker_notes(
    decks, browser, measured, read_notebook, tmp_path
):
    for lesson, deck in decks.items():
        pdf = tmp_path / f"{lesson.stem}.pdf"
        browser.events.clear()
        slides, notes = handout.print_deck(browser, deck, pdf)
        assert slides == len(measured[lesson]["slides"])
        assert handout.pdf_page_count(pdf.read_bytes()) == slides, lesson.stem
        notebook = read_notebook(lesson)
        slides_with_notes = [opener for opener in slide_openers(notebook)
                             if opener_has_notes(notebook, opener)]
        # printed at the foot of their slide
        assert notes == len(slides_with_notes) > 0, lesson.stem
        assert browser.errors() == []


def opener_has_notes(notebook, opener):
    """Whether the slide that `opener` opens holds a `notes` cell."""
    openers = {id(cell) for cell in slide_openers(notebook)}
    cells = notebook["cells"]
    start = next(i for i, cell in enumerate(cells) if cell is opener)
    for cell in cells[start + 1:]:
        if id(cell) in openers:
            return False
        if slide_type(cell) == "notes":
            return True
    return False


def test_the_pdf_page_counter_reads_a_page_tree():
    pdf = b"%PDF-1.4\n1 0 obj << /Type /Catalog /Pages 2 0 R >> endobj\n" \
          b"2 0 obj << /Type /Pages /Kids [3 0 R 4 0 R 5 0 R] /Count 3 >> endobj\n"
    assert handout.pdf_page_count(pdf) == 3
    with pytest.raises(ValueError, match="no page tree"):
        handout.pdf_page_count(b"not a pdf")


# --- The live deck: RISE in JupyterLab
# ------------------------------------------------------------

# What RISE's own page logs with any notebook (jupyterlab-rise 0.43.1, checked on a
# notebook without the course's metadata too): the widget manager of ipywidgets 8 does
# not load there (https://github.com/jupyterlab-contrib/rise/issues/119: the slides
# render, widgets do not); its web components report a recursion in their change
# notifications; and it links optional style sheets, rise.css and <notebook>.css, beside
# the notebook, which the course does not have.
KNOWN_RISE_ERRORS = re.compile("|".join([
    r"Shared module @jupyterlab/console doesn't exist in shared scope default",
    r"^RangeError: Maximum call stack size exceeded$",
    r"^Refused to apply style from '[^']*/files/[^']*\.css' because its MIME type "
    r"\('text/html'\)",
]))
RISE_TITLE = """(() => {
  const frame = [...document.querySelectorAll('iframe')]
    .find(f => (f.src || '').includes('/rise/'));
  const title = frame && frame.contentDocument
                && frame.contentDocument.querySelector(
                     '.reveal .slides section.present h1');
  if (!title) return null;
  const box = title.getBoundingClientRect();
  const style = frame.contentWindow.getComputedStyle(title);
  return {text: title.innerText, url: frame.src, transform: style.textTransform,
          visible: box.width > 0 && box.height > 0 && box.top < frame.clientHeight
                   && box.bottom > 0 && style.visibility !== 'hidden'};
})()"""


@pytest.fixture(scope="module")
def lab_with_one_lesson(tmp_path_factory):
    """JupyterLab serving a copy of lesson 1 (RISE saves the notebook it presents), with
    fresh settings."""
    root = tmp_path_factory.mktemp("live")
    lesson = next(p for p in LESSONS if p.stem.startswith("01_"))
    shutil.copy(lesson, root / lesson.name)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ,
           "JUPYTERLAB_SETTINGS_DIR": str(tmp_path_factory.mktemp("settings")),
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path_factory.mktemp("workspaces"))}
    process = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--allow-root",
         f"--port={port}", "--ServerApp.ip=127.0.0.1", "--IdentityProvider.token=live",
         f"--ServerApp.root_dir={root}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=root,
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 90
    while True:
        try:
            urllib.request.urlopen(f"{url}/api/status?token=live", timeout=2)
            break
        except OSError:
            if time.time() > deadline or process.poll() is not None:
                process.kill()
                raise RuntimeError("jupyter lab did not start within 90 s") from None
            time.sleep(0.3)
    yield url, lesson
    process.terminate()  # the server shuts its kernel down first
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def test_the_live_rise_slideshow_starts_on_the_title_slide(
    lab_with_one_lesson, browser, read_notebook
):
    url, lesson = lab_with_one_lesson
    browser.events.clear()
    toolbar_button = '.jp-NotebookPanel-toolbar [data-jp-item-name="RISE-button"]'
    browser.open(f"{url}/lab/tree/{lesson.name}?token=live&reset",
                 ready=f"!!document.querySelector('{toolbar_button} jp-button')",
                 timeout=120)
    assert browser.evaluate(f"document.querySelector('{toolbar_button} jp-button')"
                            ".getAttribute('data-command')") == "RISE:preview"
    # Select the title cell with a click, then press the button's shortcut, Alt+R (in
    # headless Chromium the toolbar button is not re-enabled once the notebook gets the
    # focus).
    browser.wait_for("!!document.querySelector('.jp-Notebook .jp-Cell "
                     ".jp-RenderedHTMLCommon h1')", timeout=60)
    x, y = browser.evaluate("(() => { const box = "
                            "document.querySelector('.jp-Notebook .jp-Cell')"
                            ".getBoundingClientRect(); return [box.x + box.width / 2, "
                            "box.y + 20]; })()")
    for kind in ("mousePressed", "mouseReleased"):
        browser.call(
            "Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1
        )
    browser.wait_for("!!document.activeElement.closest('.jp-Notebook')", timeout=30,
                     what="the notebook's focus")
    for kind in ("rawKeyDown", "keyUp"):
        browser.call("Input.dispatchKeyEvent", type=kind, modifiers=1, key="r",
                     code="KeyR", windowsVirtualKeyCode=82, nativeVirtualKeyCode=82)
    try:
        browser.wait_for("!!document.querySelector('iframe[src*=\"/rise/\"]')",
                         timeout=60, what="RISE's panel")
    finally:
        screenshot = browser.call("Page.captureScreenshot", format="png")["data"]
        (SLIDES_DIR / f"{lesson.stem}.rise.png").write_bytes(
            base64.b64decode(screenshot)
        )
    title = browser.wait_for(RISE_TITLE, timeout=120, what="RISE's title slide")
    screenshot = browser.call("Page.captureScreenshot", format="png")["data"]
    (SLIDES_DIR / f"{lesson.stem}.rise.png").write_bytes(base64.b64decode(screenshot))
    heading = ("".join(read_notebook(lesson)["cells"][0]["source"]) .splitlines()[0]
               .lstrip("# "))
    assert title["visible"] and title["text"].lower() == heading.lower(), title
    assert f"/rise/{lesson.name}" in title["url"], title
    # the notebook's "rise" metadata is in force: the static decks' white theme, whose
    # headings are upper-case (RISE's default theme, "simple", leaves them as written)
    assert title["transform"] == "uppercase", title
    unexpected = [
        error for error in browser.errors() if not KNOWN_RISE_ERRORS.search(error)
    ]
    assert not unexpected
