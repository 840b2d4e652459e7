"""`make handout`: one PDF per lesson in build/handouts (a translated lesson's in
build/handouts/<language>/), printed from its static deck by headless Chromium.

One slide per page (reveal.js's print mode, `?print-pdf`): fragments are shown all at
once rather than one page each, a slide is never continued on a second page, and speaker
notes are printed at the bottom of their slide's page. Needs the decks (`make slides`)
and Chromium; works offline.

The browser is driven by tests/chromium.py, the DevTools client the slide tests use.
"""
import base64
import importlib.util
import re
import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parent


def _load(path):
    """A script of tools/ or tests/ (folders of scripts, not packages), by its path."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build_slides = _load(TOOLS / "build_slides.py")
chromium = _load(TOOLS.parent / "tests" / "chromium.py")

HANDOUT_DIR = build_slides.REPO_ROOT / "build" / "handouts"
# reveal.js reads its settings from the query string too (Reveal.initialize merges
# getQueryHash()): all fragments on one page, a slide never continued on a second page,
# the speaker notes printed, and pages 20 % larger than the slide, so that the notes sit
# in the margin below a full slide.
PRINT_QUERY = ("?print-pdf&showNotes=true&pdfSeparateFragments=false"
               "&pdfMaxPagesPerSlide=1&margin=0.2")


def pdf_page_count(data):
    """The number of pages of a PDF (bytes), read from its page tree; no PDF library
    needed."""
    counts = [
        int(n) for n in re.findall(rb"/Type\s*/Pages\b[^>]*?/Count\s+(\d+)", data)
    ]
    counts += [
        int(n) for n in re.findall(rb"/Count\s+(\d+)[^>]*?/Type\s*/Pages\b", data)
    ]
    if not counts:
        raise ValueError("no page tree found: not a PDF, or one with "
                         "compressed object streams")
    return max(counts)  # the root of the page tree counts every page


def print_deck(page, deck, pdf):
    """Print one static deck to `pdf`, one slide per page; return (slides, slides with
    notes) printed."""
    page.open(
        deck.as_uri() + PRINT_QUERY, ready="!!document.querySelector('.reveal.ready')"
    )
    # reveal.js lays the pages out after it is ready; wait until every slide sits in a
    # page
    slides = page.wait_for("(() => { const Reveal = "
                           "require('reveal.js/dist/reveal.js');"  # loaded by RequireJS
                           "  const total = Reveal.getTotalSlides();"
                           "  return document.querySelectorAll('.pdf-page').length "
                           "=== total && total; })()",
                           what=f"{deck.name}'s print layout")
    notes = page.evaluate("document.querySelectorAll('.pdf-page "
                          ".speaker-notes-pdf').length")
    printed = page.call("Page.printToPDF", printBackground=True, preferCSSPageSize=True)
    pdf.write_bytes(base64.b64decode(printed["data"]))
    return slides, notes


def main():
    """Print every lesson's deck (what `make handout` runs, after `make slides`)."""
    # (deck, PDF) for every lesson, English first, then each translation
    folders = [("", build_slides.LESSONS)]
    folders += [(language, lessons)
                for language, lessons in build_slides.TRANSLATED_LESSONS.items()]
    decks = [(build_slides.SLIDES_DIR / language / f"{lesson.stem}.slides.html",
              HANDOUT_DIR / language / f"{lesson.stem}.pdf")
             for language, lessons in folders for lesson in lessons]
    missing = [deck.relative_to(build_slides.SLIDES_DIR).as_posix()
               for deck, _ in decks if not deck.exists()]
    if missing:
        raise SystemExit(f"no deck for {', '.join(missing)}: run `make slides` first")
    with chromium.Chromium() as page:
        for deck, pdf in decks:
            pdf.parent.mkdir(parents=True, exist_ok=True)
            slides, notes = print_deck(page, deck, pdf)
            pages = pdf_page_count(pdf.read_bytes())
            print(f"wrote {pdf.relative_to(build_slides.REPO_ROOT)}: {pages} pages "
                  f"for {slides} slides, "
                  f"speaker notes on {notes}")
            if pages != slides or page.errors():
                raise SystemExit(f"{deck.name}: {pages} pages for {slides} slides; "
                                 f"page errors: {page.errors()}")


if __name__ == "__main__":
    sys.exit(main())
