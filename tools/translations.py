"""`make translations`: the Hindi and Turkish notebooks, made from the English ones and
the translation catalogs in locales/ (issue 33).

The English notebooks are the only source of code, outputs and cell metadata. A
catalog, ``locales/<lang>/<notebook stem>.po`` (``locales/<lang>/practice/...`` for a
practice notebook), holds one gettext entry per markdown cell: its context is the cell's
id, its msgid the English text, its msgstr the translation. Any PO editor (Poedit,
Lokalize, Weblate) reads it.

    python tools/translations.py import DIR     # translators' JSON files -> catalogs
    python tools/translations.py init LANG NB   # an empty catalog for a notebook
    python tools/translations.py update         # catalogs follow the English notebooks
    python tools/translations.py build [--out DIR]  # notebooks/<lang>/ from catalogs
    python tools/translations.py status         # translated / fuzzy / untranslated

``update``: a new markdown cell gets an untranslated entry; a cell whose English changed
gets its new English as msgid, the English its translation was made for as previous
msgid, and the ``fuzzy`` flag (outdated); a removed cell's entry becomes obsolete
(``#~``), kept for when it comes back. ``build`` writes, for every notebook with a
catalog, the English notebook with each markdown cell's text replaced: by its
translation, or, while the entry is fuzzy or untranslated, by the English text and a
short note in the language that its translation is being updated. Links to another
notebook lead to that notebook in the same language (to the English one while the
language has none), and links to other files still reach them. Everything else, down to
the JSON's formatting, is the English file's.
"""
import argparse
import json
import os
import re
import sys
from pathlib import Path

import polib

from helpers.language import LANGUAGES
from helpers.paths import REPO_ROOT

NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
LOCALES_DIR = REPO_ROOT / "locales"
GLOSSARY_HEADER = ["english", "translation", "source"]
GLOSSARY_SOURCES = {"deck", "chosen"}  # the seed deck's own word, or a standard term

# shown under a cell whose translation is outdated (fuzzy) or missing
OUTDATED_NOTE = {
    "hi": "*(इस हिस्से का अनुवाद अपडेट किया जा रहा है; तब तक यह अंग्रेज़ी में है।)*",
    "tr": "*(Bu bölümün çevirisi güncelleniyor; o zamana kadar İngilizce.)*",
}
FUZZY = "fuzzy"

# a Markdown link or image target, and an HTML href or src
LINK = re.compile(r"(\]\()(?P<target>[^)\s]+)(\))"
                  r"|(\b(?:href|src)=\")(?P<html_target>[^\"]+)(\")")
EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|#|/)", re.I)


def english_notebooks():
    """The English notebooks: notebooks/*.ipynb and notebooks/practice/*.ipynb."""
    return sorted([*NOTEBOOKS_DIR.glob("*.ipynb"),
                   *(NOTEBOOKS_DIR / "practice").glob("*.ipynb")])


def relative_notebook(notebook):
    """``practice/01_x_practice`` for notebooks/practice/01_x_practice.ipynb (no
    suffix)."""
    return notebook.relative_to(NOTEBOOKS_DIR).with_suffix("").as_posix()


def catalog_path(language, notebook, locales=None):
    locales = locales or LOCALES_DIR
    return locales / language / f"{relative_notebook(notebook)}.po"


def generated_path(language, notebook, out=None):
    out = out or NOTEBOOKS_DIR
    return out / language / notebook.relative_to(NOTEBOOKS_DIR)


def cell_text(cell):
    source = cell["source"]
    return source if isinstance(source, str) else "".join(source)


def markdown_cells(notebook_json):
    """(cell id, English text) of every non-empty markdown cell, in order."""
    return [(cell["id"], cell_text(cell)) for cell in notebook_json["cells"]
            if cell["cell_type"] == "markdown" and cell_text(cell)]


def read_notebook(path):
    return json.loads(Path(path).read_text(encoding="utf-8"))


def notebook_json_text(notebook_json):
    """The notebook as nbformat writes it (and as the English files are stored)."""
    return json.dumps(notebook_json, indent=1, sort_keys=True,
                      ensure_ascii=False) + "\n"


def slide_type(cell):
    return cell.get("metadata", {}).get("slideshow", {}).get("slide_type")


# --- Catalogs -----------------------------------------------------------------------

def new_catalog(language):
    catalog = polib.POFile(wrapwidth=0)  # one PO line per Markdown line, never wrapped
    catalog.metadata = {
        "Project-Id-Version": "Efficient AI model training with PyTorch",
        "Language": language,
        "MIME-Version": "1.0",
        "Content-Type": "text/plain; charset=UTF-8",
        "Content-Transfer-Encoding": "8bit",
        "X-Source-Language": "en",
    }
    return catalog


def load_catalog(path):
    catalog = polib.pofile(str(path), wrapwidth=0)
    catalog.wrapwidth = 0
    return catalog


def catalogs(language, locales=None):
    """{English notebook: catalog path} for every catalog of ``language``."""
    locales = locales or LOCALES_DIR
    found = {}
    for notebook in english_notebooks():
        path = catalog_path(language, notebook, locales)
        if path.exists():
            found[notebook] = path
    return found


def languages(locales=None):
    locales = locales or LOCALES_DIR
    return [language for language in LANGUAGES if (locales / language).is_dir()]


def is_translated(entry):
    return bool(entry.msgstr) and FUZZY not in entry.flags and not entry.obsolete


def save_if_changed(catalog, path):
    """Write the catalog, unless the file already says the same (no churn)."""
    text = str(catalog)
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return True
    return False


def synced(catalog, notebook, english=None):
    """``catalog`` made to follow the English ``notebook``: new cells, changed English
    (fuzzy), removed cells (obsolete), in the notebook's order; returns a new
    catalog."""
    notebook_json = read_notebook(notebook)
    cells = {cell["id"]: cell for cell in notebook_json["cells"]}
    by_id = {entry.msgctxt: entry for entry in catalog}
    result = new_catalog(catalog.metadata.get("Language", ""))
    result.metadata = dict(catalog.metadata)
    where = (notebook.relative_to(REPO_ROOT).as_posix()
             if notebook.is_relative_to(REPO_ROOT) else notebook.name)
    for cell_id, text in markdown_cells(notebook_json):
        entry = by_id.pop(cell_id, None)
        if entry is None:
            entry = polib.POEntry(msgctxt=cell_id, msgid=text, msgstr="")
        entry.obsolete = False
        if entry.msgid != text:
            if entry.msgstr and FUZZY not in entry.flags:
                # the English this translation was made for, for the translator to diff
                entry.previous_msgid = entry.msgid
                entry.flags.append(FUZZY)
            entry.msgid = text
        if FUZZY in entry.flags and entry.previous_msgid == text:
            # the English went back to what the translation translates
            entry.flags.remove(FUZZY)
        if FUZZY not in entry.flags:
            entry.previous_msgid = None
        entry.occurrences = [(where, "")]
        kind = slide_type(cells[cell_id])
        entry.comment = f"slide type: {kind}" if kind else ""
        result.append(entry)
    for entry in by_id.values():  # cells no longer in the notebook
        if entry.msgstr:
            entry.obsolete = True
            entry.occurrences = []
            result.append(entry)
    return result


def update(locales=None):
    """Every catalog follows its English notebook; returns the catalogs rewritten."""
    locales = locales or LOCALES_DIR
    changed = []
    for language in languages(locales):
        for notebook, path in catalogs(language, locales).items():
            if save_if_changed(synced(load_catalog(path), notebook), path):
                changed.append(path)
    return changed


def init(language, notebooks, locales=None):
    """An empty catalog (every cell untranslated) for each notebook that has none."""
    locales = locales or LOCALES_DIR
    made = []
    for notebook in notebooks:
        if Path(notebook).resolve() not in english_notebooks():
            raise SystemExit(f"{notebook}: not an English notebook (notebooks/*.ipynb "
                             "or notebooks/practice/*.ipynb)")
        path = catalog_path(language, Path(notebook).resolve(), locales)
        if not path.exists():
            save_if_changed(synced(new_catalog(language), Path(notebook).resolve()),
                            path)
            made.append(path)
    return made


def import_translations(folder, locales=None):
    """The translators' files (FORMAT.md of issue 33) into the catalogs.

    ``folder/<lang>/<stem>.json`` (``practice/<stem>.json``): ``{cell id: {"en": the
    English translated, "text": the translation}}``; ``folder/<lang>/glossary.tsv``.
    An entry is fuzzy when its "en" is not the notebook's English today. Returns
    (catalogs written, problems found in the translated Markdown).
    """
    locales = locales or LOCALES_DIR
    written, problems = [], []
    for language in LANGUAGES:
        source = Path(folder) / language
        if not source.is_dir():
            continue
        glossary = source / "glossary.tsv"
        if glossary.exists():
            rows = read_glossary(glossary)
            target = locales / language / "glossary.tsv"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("".join("\t".join(row) + "\n" for row in rows),
                              encoding="utf-8")
        for file in sorted(source.rglob("*.json")):
            relative = file.relative_to(source).with_suffix(".ipynb")
            notebook = NOTEBOOKS_DIR / relative
            if not notebook.exists():
                problems.append(f"{file}: no notebook "
                                f"{notebook.relative_to(REPO_ROOT)}")
                continue
            translated = json.loads(file.read_text(encoding="utf-8"))
            path = catalog_path(language, notebook, locales)
            catalog = load_catalog(path) if path.exists() else new_catalog(language)
            by_id = {entry.msgctxt: entry for entry in catalog}
            for cell_id, pair in translated.items():
                entry = by_id.get(cell_id)
                if entry is None:
                    entry = polib.POEntry(msgctxt=cell_id, msgid=pair["en"])
                    catalog.append(entry)
                    by_id[cell_id] = entry
                entry.msgid, entry.msgstr = pair["en"], pair["text"]
                entry.flags = [flag for flag in entry.flags if flag != FUZZY]
                entry.previous_msgid = None
                problems += [f"{language}/{relative.with_suffix('')} {cell_id}: {p}"
                             for p in markdown_problems(pair["en"], pair["text"])]
            # English changed since the translator read it: synced() marks it fuzzy
            if save_if_changed(synced(catalog, notebook), path):
                written.append(path)
    return written, problems


def read_glossary(path):
    """The rows of a glossary.tsv, header first; a clear error for a malformed one."""
    rows = [line.split("\t") for line in
            Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    if not rows or rows[0] != GLOSSARY_HEADER:
        raise SystemExit(f"{path}: the first line must be "
                         f"{chr(9).join(GLOSSARY_HEADER)!r} (tab-separated)")
    for number, row in enumerate(rows[1:], start=2):
        if len(row) != 3 or row[2] not in GLOSSARY_SOURCES or not all(row):
            raise SystemExit(f"{path}, line {number}: expected english<TAB>translation"
                             f"<TAB>deck or chosen, got {row!r}")
    return rows


# --- The Markdown a translation must keep -------------------------------------------

FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
MARKDOWN_LINK_TARGET = re.compile(r"\]\(([^)\s]+)\)")
HTML_TAG = re.compile(r"</?([a-z]+)\b[^>]*>", re.I)
HTML_ATTRIBUTE = re.compile(r"\b(id|href|src)=\"([^\"]*)\"")


def table_shapes(text):
    """The number of columns of each table row, table by table (``|``-separated lines,
    code spans taken out first, since a `|` inside one is not a column)."""
    shapes, current = [], []
    for line in CODE_SPAN.sub("code", FENCE.sub("", text)).splitlines():
        stripped = line.strip()
        if stripped.startswith("|") and stripped.endswith("|") and len(stripped) > 1:
            current.append(len(re.split(r"(?<!\\)\|", stripped)) - 2)
        elif current:
            shapes.append(current)
            current = []
    if current:
        shapes.append(current)
    return shapes


def heading_levels(text):
    return [len(m.group(1)) for m in re.finditer(r"^(#{1,6}) ", FENCE.sub("", text),
                                                 re.M)]


def markdown_problems(english, translation):
    """What the translation lost of the English Markdown's structure, in words: code
    blocks and code spans (kept exactly), link and image targets, HTML tags and their
    ids and targets, headings, tables (same rows and columns), the blank line after an
    Under-the-hood summary. Empty when it kept them all."""
    problems = []
    if FENCE.findall(english) != FENCE.findall(translation):
        problems.append("a code block differs")
    outside_fences = [FENCE.sub("", text) for text in (english, translation)]
    spans = [sorted(m.group(0) for m in CODE_SPAN.finditer(text))
             for text in outside_fences]
    if spans[0] != spans[1]:
        lost = sorted(set(spans[0]) - set(spans[1]))
        added = sorted(set(spans[1]) - set(spans[0]))
        problems.append(f"code spans differ (lost {lost}, added {added})"
                        if lost or added else "a code span occurs another number of "
                                              "times")
    targets = [sorted(MARKDOWN_LINK_TARGET.findall(text)) for text in outside_fences]
    if targets[0] != targets[1]:
        problems.append(f"link targets differ: {targets[0]} became {targets[1]}")
    tags = [sorted(m.group(0).split()[0].lower().rstrip(">") for m in
                   HTML_TAG.finditer(CODE_SPAN.sub("", text)))
            for text in outside_fences]
    if tags[0] != tags[1]:
        problems.append(f"HTML tags differ: {tags[0]} became {tags[1]}")
    attributes = [sorted(HTML_ATTRIBUTE.findall(text)) for text in outside_fences]
    if attributes[0] != attributes[1]:
        problems.append(f"HTML ids or targets differ: {attributes[0]} became "
                        f"{attributes[1]}")
    if heading_levels(english) != heading_levels(translation):
        problems.append(f"headings differ: levels {heading_levels(english)} became "
                        f"{heading_levels(translation)}")
    if table_shapes(english) != table_shapes(translation):
        problems.append(f"tables differ: columns per row {table_shapes(english)} "
                        f"became {table_shapes(translation)}")
    summary = re.compile(r"</summary>\n\n")
    if bool(summary.search(english)) != bool(summary.search(translation)):
        problems.append("no blank line after </summary> (JupyterLab would not render "
                        "the Markdown inside)")
    return problems


# --- Generated notebooks ------------------------------------------------------------

def rewrite_links(text, english_dir, generated_dir, language, in_language):
    """Relative links made to work from the generated notebook's folder: a notebook
    in ``in_language`` (the English notebooks generated in ``language``) leads to its
    generated version, any other file to the English one."""
    def target_from_here(target):
        if EXTERNAL.match(target):
            return target
        path, _, fragment = target.partition("#")
        english_target = (english_dir / path).resolve()
        final = english_target
        if english_target.suffix == ".ipynb" and english_target.is_relative_to(
                NOTEBOOKS_DIR):
            if english_target in in_language:
                final = generated_path(language, english_target)
        relative = Path(os.path.relpath(final, generated_dir)).as_posix()
        return relative + ("#" + fragment if fragment else "")

    def replace(match):
        if match.group("target") is not None:
            return (match.group(1) + target_from_here(match.group("target"))
                    + match.group(3))
        return (match.group(4) + target_from_here(match.group("html_target"))
                + match.group(6))
    return LINK.sub(replace, text)


def translated_text(entry, english, language):
    """A cell's Markdown in ``language``: its translation, or the English and a note
    while the translation is outdated or missing."""
    if entry is not None and is_translated(entry) and entry.msgid == english:
        return entry.msgstr
    return f"{english.rstrip()}\n\n{OUTDATED_NOTE[language]}"


def generated_notebook(notebook, catalog, language, in_language):
    """The JSON text of ``notebook`` in ``language``: only markdown cells' source
    differ. ``in_language``: the English notebooks generated in ``language`` too."""
    notebook_json = read_notebook(notebook)
    by_id = {entry.msgctxt: entry for entry in catalog if not entry.obsolete}
    # where it is committed (links are relative), wherever ``out`` writes it
    generated_dir = generated_path(language, notebook).parent
    for cell in notebook_json["cells"]:
        english = cell_text(cell)
        if cell["cell_type"] != "markdown" or not english:
            continue
        text = translated_text(by_id.get(cell["id"]), english, language)
        text = rewrite_links(text, notebook.parent, generated_dir, language,
                             in_language)
        cell["source"] = text.splitlines(True)  # as nbformat stores it
    return notebook_json_text(notebook_json)


def build(out=None, locales=None):
    """Write notebooks/<lang>/ for every notebook with a catalog; remove generated
    notebooks whose catalog is gone. Returns the files written."""
    locales = locales or LOCALES_DIR
    out = out or NOTEBOOKS_DIR
    written = []
    for language in languages(locales):
        wanted = set()
        found = catalogs(language, locales)
        for notebook, path in found.items():
            target = generated_path(language, notebook, out)
            text = generated_notebook(notebook, load_catalog(path), language,
                                      set(found))
            wanted.add(target)
            if not target.exists() or target.read_text(encoding="utf-8") != text:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text, encoding="utf-8")
                written.append(target)
        for stale in (out / language).rglob("*.ipynb"):
            if stale not in wanted and ".ipynb_checkpoints" not in stale.parts:
                stale.unlink()
    return written


def counts(catalog):
    """{"translated", "fuzzy", "untranslated", "obsolete"}: the catalog's entries."""
    live = [entry for entry in catalog if not entry.obsolete]
    return {"translated": sum(is_translated(entry) for entry in live),
            "fuzzy": sum(FUZZY in entry.flags for entry in live),
            "untranslated": sum(not entry.msgstr for entry in live),
            "obsolete": sum(entry.obsolete for entry in catalog)}


def status(locales=None):
    """Lines: per language and notebook, translated / fuzzy / untranslated cells."""
    locales = locales or LOCALES_DIR
    lines = []
    for language in languages(locales):
        found = catalogs(language, locales)
        total = dict.fromkeys(("translated", "fuzzy", "untranslated", "obsolete"), 0)
        for notebook, path in found.items():
            numbers = counts(load_catalog(path))
            total = {key: total[key] + numbers[key] for key in total}
            lines.append(f"  {language} {relative_notebook(notebook)}: "
                         + ", ".join(f"{n} {key}" for key, n in numbers.items()))
        missing = [relative_notebook(nb) for nb in english_notebooks()
                   if nb not in found]
        lines.append(f"{language} ({LANGUAGES[language]}): "
                     + ", ".join(f"{n} {key}" for key, n in total.items())
                     + f"; {len(found)} notebooks, no catalog yet for {len(missing)}"
                     + (f": {', '.join(missing)}" if missing else ""))
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    imported = commands.add_parser("import", help="translators' JSON into catalogs")
    imported.add_argument("folder", type=Path, help="holds hi/ and tr/ (FORMAT.md)")
    started = commands.add_parser("init", help="an empty catalog for notebooks")
    started.add_argument("language", choices=sorted(LANGUAGES))
    started.add_argument("notebooks", nargs="+", type=Path)
    commands.add_parser("update", help="catalogs follow the English notebooks")
    built = commands.add_parser("build", help="write notebooks/<lang>/")
    built.add_argument("--out", type=Path, default=None,
                       help="instead of notebooks/ (for the tests)")
    commands.add_parser("status", help="translated / fuzzy / untranslated cells")
    arguments = parser.parse_args(argv)

    def show(paths, verb):
        for path in paths:
            print(f"{verb} {Path(os.path.relpath(path)).as_posix()}")

    if arguments.command == "import":
        written, problems = import_translations(arguments.folder)
        show(written, "wrote")
        for problem in problems:
            print(f"check the Markdown of {problem}")
    elif arguments.command == "init":
        show(init(arguments.language, arguments.notebooks), "started")
    elif arguments.command == "update":
        show(update(), "updated")
    elif arguments.command == "build":
        show(build(arguments.out and arguments.out.resolve()), "wrote")
    if arguments.command in ("import", "update", "status"):
        print("\n".join(status()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
