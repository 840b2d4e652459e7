"""`make slides`: render each lesson into a static reveal.js deck in build/slides
(git-ignored), and each translated lesson (notebooks/hi/, notebooks/tr/) into
build/slides/<language>/.

The decks work offline: reveal.js, jQuery and RequireJS are copied next to them from npm
packages (installed once into build/npm), and figures are embedded in the HTML. The
lessons use no LaTeX or Mermaid diagrams, and widgets need a running kernel, so small
stubs stand in for MathJax, Mermaid and the widget renderer, which the template would
fetch from CDNs.

The decks are laid out for a 16:9 projector: reveal.js's slide box is 1280 x 720, the
theme's font sizes are kept, code wraps at the slide's edge instead of being cut
(course.css), the "In [ ]:" prompts are left out (they took 110 px of every line), a
cell tagged `slide-output-only` shows only its output, and figures are enlarged to be
read from the back of the room (`size_figures`). The rules the lessons follow are in
tests/test_slides.py's docstring.
"""
import base64
import re
import shutil
import struct
import subprocess
import sys

from helpers.language import LANGUAGES
from helpers.paths import REPO_ROOT

SLIDES_DIR = REPO_ROOT / "build" / "slides"
NPM_DIR = REPO_ROOT / "build" / "npm"
# a new lesson 0N is picked up; a lesson's lab (0N_<topic>_lab.ipynb) is not a deck
LESSONS = sorted(p for p in (REPO_ROOT / "notebooks").glob("0[1-9]_*.ipynb")
                 if not p.stem.endswith("_lab"))
# The lessons made in each language by `make translations` (notebooks/hi/, ...): decks
# in build/slides/<language>/, a folder with its own reveal.js and assets, so that it
# works when copied alone (and the handout finds reveal.js under the same name).
TRANSLATED_LESSONS = {
    language: sorted(p for p in (REPO_ROOT / "notebooks" / language).glob(
        "0[1-9]_*.ipynb") if not p.stem.endswith("_lab"))
    for language in LANGUAGES}
NPM_PACKAGES = ["reveal.js@4.6.0", "jquery@3.7.1", "requirejs@2.3.7",
                "@fontsource/noto-sans-devanagari@5.3.0"]
# A language whose script a projector's laptop or a CI machine may have no font for: its
# decks carry one (woff2 files in assets/, used for that script's characters only, so
# the Latin text keeps the theme's fonts). Without it, Chromium drew Hindi as boxes.
# (npm package, its file of one weight, font family, weights; the Unicode range of
# fontsource's devanagari subset, as its 400.css declares it.)
SCRIPT_FONTS = {
    "hi": ("@fontsource/noto-sans-devanagari",
           "files/noto-sans-devanagari-devanagari-{weight}-normal.woff2",
           "Noto Sans Devanagari", (400, 700),
           "U+0900-097F,U+1CD0-1CF9,U+200C-200D,U+20A8,U+20B9,U+20F0,U+25CC,"
           "U+A830-A839,U+A8E0-A8FF,U+11B00-11B09"),
}
# reveal.js's slide box: 16:9, scaled to fit the window
SLIDE_WIDTH, SLIDE_HEIGHT = 1280, 720
# a cell whose code stays in the notebook, off the slide
OUTPUT_ONLY_TAG = "slide-output-only"
# Figures on a slide: FIGURE_ZOOM times their size in JupyterLab, but at least
# FIGURE_MIN_WIDTH (readable from the back of the room), at most FIGURE_MAX_WIDTH, and
# no taller than FIGURE_MAX_HEIGHT unless that would make them narrower than
# FIGURE_MIN_WIDTH (CSS px).
FIGURE_ZOOM = 1.3
FIGURE_MIN_WIDTH = round(0.62 * SLIDE_WIDTH)
FIGURE_MAX_WIDTH = round(0.80 * SLIDE_WIDTH)
FIGURE_MAX_HEIGHT = 420
# The lessons' depth sits in speaker notes, in <details> blocks (STYLE.md, "The
# learner's path").
UNDER_THE_HOOD, UNDER_THE_HOOD_OPEN = "<details><summary>", "<details open><summary>"
MATHJAX_STUB = """// No LaTeX in the lessons: a no-op MathJax for the reveal.js template
window.MathJax = {Hub: {Config: function () {}, Queue: function () {},
                        getAllJax: function () { return []; },
                        Rerender: function () {}}};
"""
COURSE_CSS = """/* The course's decks (tools/build_slides.py), on top of nbconvert's
   reveal template and the white theme: the theme's font sizes stay; paragraphs are
   spaced closer; code wraps at the slide's edge instead of being cut. */
.reveal .jp-RenderedHTMLCommon p {
  /* the theme's 20px above and below each paragraph took a line's height */
  margin: 0.5em 0;
}
.reveal .jp-RenderedHTMLCommon li {
  line-height: 1.4;  /* the theme's 1.6 */
}
.reveal .jp-InputArea-editor pre, .reveal .jp-OutputArea-output pre {
  white-space: pre-wrap;
  overflow-wrap: anywhere;
  /* the template's width: 100% plus padding ran past the slide's edge */
  box-sizing: border-box;
}
.reveal div.jp-OutputArea-output > pre {
  width: auto;  /* nbconvert's template gives printed text only 90 % of the width */
}
.reveal .jp-RenderedImage img {
  height: auto;
  max-width: 100%;
}
/* print-pdf (make handout): no blank page after the last slide; speaker notes on
   their slide's page, small, at the bottom */
html.print-pdf .reveal .slides .pdf-page:last-of-type {
  page-break-after: avoid;
  break-after: avoid;
}
html.print-pdf .reveal .speaker-notes-pdf {
  padding: 4px 10px;
  background: rgba(255, 255, 255, 0.92);
  border: 1px solid #ccc;
}
html.print-pdf .reveal .speaker-notes-pdf .jp-RenderedHTMLCommon {
  font-size: 14px;
  line-height: 1.3;
}
html.print-pdf .reveal .speaker-notes-pdf p {
  margin: 0;
}
"""


# With reveal_scroll, nbconvert's template makes a slide scroll when it is taller than
# 95 % of the window, in window pixels, while the slide's height is in the slide's own
# (unscaled) pixels: at 1280 x 720 a slide that fits its 720 px box but is over 684 px
# tall became a scroll box, shifted down 20 px and cut at the bottom. render() compares
# it with the slide box instead.
SCROLL_THRESHOLD = "var h = $('.reveal').height() * 0.95;"

# nbconvert's reveal template imports Mermaid (diagrams in Markdown; the lessons have
# none) from a CDN whatever the settings say: render() removes that script from each
# deck.
MERMAID_IMPORT = re.compile(r"<script type=\"module\">\s*import mermaid from "
                            r"[^<]*</script>\s*")
PNG_IMAGE = re.compile(
    r'<img (?P<attributes>[^>]*?)src="data:image/png;base64,(?P<data>[^"]+)"'
)


def language_css(language):
    """The style sheet of a language's decks: its script's font (SCRIPT_FONTS), put
    first in the theme's and JupyterLab's font lists; empty for a Latin script."""
    if language not in SCRIPT_FONTS:
        return ""
    *_, family, weights, unicode_range = SCRIPT_FONTS[language]
    faces = "".join(f"""@font-face {{
  font-family: '{family}';
  font-style: normal;
  font-weight: {weight};
  src: url(./{language}-{weight}.woff2) format('woff2');
  unicode-range: {unicode_range};
}}
""" for weight in weights)
    return faces + f""".reveal .slides h1, .reveal .slides h2, .reveal .slides h3,
.reveal .slides h4, .reveal .slides h5, .reveal .slides h6 {{
  font-family: '{family}', var(--r-heading-font);
}}
.reveal .jp-RenderedHTMLCommon, .reveal .speaker-notes-pdf {{
  font-family: '{family}', var(--jp-content-font-family);
}}
"""


def install_assets(folder=SLIDES_DIR, language="en"):
    """Put reveal.js, jQuery, RequireJS, the offline stubs, course.css and
    ``language``'s style sheet and font (language.css) in ``folder`` (build/slides, or
    a language's folder in it; npm once, the first time)."""
    modules = NPM_DIR / "node_modules"
    if not all((modules / package.rsplit("@", 1)[0]).is_dir()
               for package in NPM_PACKAGES):
        if shutil.which("npm") is None:
            raise SystemExit("make slides needs npm once, to fetch reveal.js; install "
                             "Node.js and npm")
        subprocess.run(
            ["npm", "install", "--prefix", str(NPM_DIR), "--no-audit", "--no-fund",
             "--silent", *NPM_PACKAGES],
            check=True,
        )
    reveal = folder / "reveal.js"
    if reveal.exists():
        shutil.rmtree(reveal)
    for part in ("dist", "plugin"):
        shutil.copytree(modules / "reveal.js" / part, reveal / part)
    assets = folder / "assets"
    assets.mkdir(parents=True, exist_ok=True)
    shutil.copy(modules / "jquery" / "dist" / "jquery.min.js", assets / "jquery.min.js")
    shutil.copy(modules / "requirejs" / "require.js", assets / "require.js")
    (assets / "mathjax-stub.js").write_text(MATHJAX_STUB)
    (assets / "no-icons.css").write_text("/* the decks use no Font Awesome icons */\n")
    (assets / "no-widgets.js").write_text("// widgets (lesson 4's calculator) need a "
                                          "running kernel: not in a static deck\n")
    (assets / "course.css").write_text(COURSE_CSS)
    (assets / "language.css").write_text(language_css(language))
    if language in SCRIPT_FONTS:
        package, file, _, weights, _ = SCRIPT_FONTS[language]
        for weight in weights:
            shutil.copy(modules / package / file.format(weight=weight),
                        assets / f"{language}-{weight}.woff2")


def figure_width(png):
    """The width (CSS px) a figure gets on a slide: see FIGURE_ZOOM."""
    width, height = struct.unpack(">II", png[16:24])  # the PNG's IHDR chunk
    largest = min(FIGURE_MAX_WIDTH / width, FIGURE_MAX_HEIGHT / height)
    zoom = max(min(FIGURE_ZOOM, largest), FIGURE_MIN_WIDTH / width)
    return round(width * zoom)


def size_figures(html):
    """Give every embedded PNG figure its width on the slide (JupyterLab shows it at its
    own size)."""
    def sized(match):
        width = figure_width(base64.b64decode(match["data"][:64]))
        return (f'<img {match["attributes"]}style="width: {width}px" '
                f'src="data:image/png;base64,{match["data"]}"')
    return PNG_IMAGE.sub(sized, html)


def render(*lessons, out=SLIDES_DIR, language="en"):
    """Render lesson notebooks into ``out`` (build/slides, or a language's folder in
    it, each with its assets: install_assets) as offline decks, in one nbconvert
    process; return the decks' paths. ``language``: the lessons' language, for the
    browser (Turkish upper case: "bir" is "BİR" in a title)."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "jupyter",
            "nbconvert",
            "--to",
            "slides",
            *map(str, lessons),
            "--output-dir",
            str(out),
            "--log-level=ERROR",
            "--SlidesExporter.reveal_url_prefix=reveal.js",
            # its fonts ship with reveal.js; "simple" fetches them
            "--SlidesExporter.reveal_theme=white",
            f"--SlidesExporter.reveal_width={SLIDE_WIDTH}",
            f"--SlidesExporter.reveal_height={SLIDE_HEIGHT}",
            # a slide allowed to be long (tests/test_slides.py) scrolls
            "--SlidesExporter.reveal_scroll=True",
            "--SlidesExporter.exclude_input_prompt=True",
            "--SlidesExporter.exclude_output_prompt=True",
            f"--TagRemovePreprocessor.remove_input_tags={OUTPUT_ONLY_TAG}",
            "--SlidesExporter.jquery_url=assets/jquery.min.js",
            "--SlidesExporter.require_js_url=assets/require.js",
            "--SlidesExporter.mathjax_url=assets/mathjax-stub.js",
            "--SlidesExporter.font_awesome_url=assets/no-icons.css",
            "--SlidesExporter.widget_renderer_url=assets/no-widgets.js",
        ],
        check=True,
    )
    decks = [out / f"{lesson.stem}.slides.html" for lesson in lessons]
    for deck in decks:
        html = MERMAID_IMPORT.sub("", deck.read_text())
        html = html.replace('<html lang="en">', f'<html lang="{language}">', 1)
        if SCROLL_THRESHOLD not in html:
            raise SystemExit(f"{deck.name}: nbconvert's reveal template changed; "
                             "revisit SCROLL_THRESHOLD")
        html = html.replace(SCROLL_THRESHOLD, f"var h = {SLIDE_HEIGHT};  // the slide "
                                              "box (tools/build_slides.py)")
        html = html.replace("</head>", '<link rel="stylesheet" '
                                       'href="assets/course.css">\n'
                                       '<link rel="stylesheet" '
                                       'href="assets/language.css">\n</head>', 1)
        # "Under the hood" blocks are collapsed in JupyterLab; in the speaker notes and
        # the handout the instructor reads them, so the decks show them open
        html = html.replace(UNDER_THE_HOOD, UNDER_THE_HOOD_OPEN)
        deck.write_text(size_figures(html))
    return decks


def main():
    """Render every lesson, in English and in each translation (what `make slides`
    runs)."""
    SLIDES_DIR.mkdir(parents=True, exist_ok=True)
    install_assets()
    # one nbconvert process per language: its start-up is most of a deck's time
    decks = render(*LESSONS)
    for language, lessons in TRANSLATED_LESSONS.items():
        if lessons:
            install_assets(SLIDES_DIR / language, language)
            decks += render(*lessons, out=SLIDES_DIR / language, language=language)
    for deck in decks:
        print(f"rendered {deck.relative_to(REPO_ROOT)}")


if __name__ == "__main__":
    main()
