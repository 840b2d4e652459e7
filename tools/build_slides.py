"""`make slides`: render each lesson into a static reveal.js deck in build/slides (git-ignored).

The decks work offline: reveal.js, jQuery and RequireJS are copied next to them from npm
packages (installed once into build/npm), and figures are embedded in the HTML. The lessons
use no LaTeX or Mermaid diagrams, and widgets need a running kernel, so small stubs stand in for
MathJax, Mermaid and the widget renderer, which the template would fetch from CDNs.
"""
import re
import shutil
import subprocess
import sys

from helpers.paths import REPO_ROOT

SLIDES_DIR = REPO_ROOT / "build" / "slides"
NPM_DIR = REPO_ROOT / "build" / "npm"
LESSONS = sorted((REPO_ROOT / "notebooks").glob("0[1-9]_*.ipynb"))
NPM_PACKAGES = ["reveal.js@4.6.0", "jquery@3.7.1", "requirejs@2.3.7"]
MATHJAX_STUB = """// The lessons use no LaTeX: a no-op MathJax for the reveal.js template, offline.
window.MathJax = {Hub: {Config: function () {}, Queue: function () {}, getAllJax: function () { return []; },
                        Rerender: function () {}}};
"""


# nbconvert's reveal template imports Mermaid (diagrams in Markdown; the lessons have none)
# from a CDN whatever the settings say: render() removes that script from each deck.
MERMAID_IMPORT = re.compile(r"<script type=\"module\">\s*import mermaid from [^<]*</script>\s*")


def install_assets():
    """Put reveal.js, jQuery, RequireJS and the offline stubs in build/slides (npm once, the first time)."""
    modules = NPM_DIR / "node_modules"
    if not (modules / "reveal.js" / "dist" / "reveal.js").exists():
        if shutil.which("npm") is None:
            raise SystemExit("make slides needs npm once, to fetch reveal.js; install Node.js and npm")
        subprocess.run(["npm", "install", "--prefix", str(NPM_DIR), "--no-audit", "--no-fund", "--silent",
                        *NPM_PACKAGES], check=True)
    reveal = SLIDES_DIR / "reveal.js"
    if reveal.exists():
        shutil.rmtree(reveal)
    for part in ("dist", "plugin"):
        shutil.copytree(modules / "reveal.js" / part, reveal / part)
    assets = SLIDES_DIR / "assets"
    assets.mkdir(parents=True, exist_ok=True)
    shutil.copy(modules / "jquery" / "dist" / "jquery.min.js", assets / "jquery.min.js")
    shutil.copy(modules / "requirejs" / "require.js", assets / "require.js")
    (assets / "mathjax-stub.js").write_text(MATHJAX_STUB)
    (assets / "no-icons.css").write_text("/* the decks use no Font Awesome icons */\n")
    (assets / "no-widgets.js").write_text("// widgets (lesson 4's calculator) need a running kernel: not in a static deck\n")


def render(*lessons):
    """Render lesson notebooks into build/slides as offline decks, in one nbconvert process; return the decks' paths."""
    subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "slides", *map(str, lessons),
                    "--output-dir", str(SLIDES_DIR), "--log-level=ERROR",
                    "--SlidesExporter.reveal_url_prefix=reveal.js",
                    "--SlidesExporter.reveal_theme=white",  # its fonts ship with reveal.js; "simple" fetches them
                    "--SlidesExporter.reveal_scroll=True",  # long slides (code and output) scroll
                    "--SlidesExporter.jquery_url=assets/jquery.min.js",
                    "--SlidesExporter.require_js_url=assets/require.js",
                    "--SlidesExporter.mathjax_url=assets/mathjax-stub.js",
                    "--SlidesExporter.font_awesome_url=assets/no-icons.css",
                    "--SlidesExporter.widget_renderer_url=assets/no-widgets.js"], check=True)
    decks = [SLIDES_DIR / f"{lesson.stem}.slides.html" for lesson in lessons]
    for deck in decks:
        deck.write_text(MERMAID_IMPORT.sub("", deck.read_text()))
    return decks


def main():
    """Render every lesson (what `make slides` runs)."""
    SLIDES_DIR.mkdir(parents=True, exist_ok=True)
    install_assets()
    for deck in render(*LESSONS):  # one nbconvert process: its start-up is most of a deck's time
        print(f"rendered {deck.relative_to(REPO_ROOT)}")


if __name__ == "__main__":
    main()
