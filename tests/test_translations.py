"""The Hindi and Turkish notebooks (issue 33): made from the English ones and the
catalogs in locales/ by tools/translations.py, never stale, never different in code.

The generated notebooks equal the English ones cell by cell except the markdown text
(so nbval runs the English ones only: conftest.py), every markdown cell is translated or
says that its translation is being updated, their links stay in their language, and the
committed files are what `make translations` writes. A translation keeps the English
Markdown's structure (code, link targets, tables, headings); a catalog holds no outdated
entry. (The practice checks' verdicts in the notebook's language: test_language.py.)
"""
import json
import re
import subprocess
import sys

import polib
import pytest
from tool_scripts import load_tool

from helpers import language
from helpers.paths import REPO_ROOT

translations = load_tool("translations")
LOCALES = translations.LOCALES_DIR
SEEDS = REPO_ROOT.parent / "shared" / "seeds"
# the seed deck each language's glossary quotes (FORMAT.md of issue 33)
SEED_DECK = {"hi": "000_*.txt", "tr": "002_*.txt"}


def generated_notebooks():
    """(language, English notebook, generated notebook, catalog) for every catalog."""
    return [(lang, notebook, translations.generated_path(lang, notebook), catalog)
            for lang in translations.languages()
            for notebook, catalog in translations.catalogs(lang).items()]


GENERATED = generated_notebooks()
IDS = [f"{lang}/{translations.relative_notebook(nb)}" for lang, nb, _, _ in GENERATED]


def test_there_are_catalogs_and_generated_notebooks_for_both_languages():
    assert {lang for lang, *_ in GENERATED} == set(language.LANGUAGES)
    assert all(path.exists() for _, _, path, _ in GENERATED), "run `make translations`"


@pytest.mark.parametrize("lang, english, generated, catalog", GENERATED, ids=IDS)
def test_a_generated_notebook_is_the_english_one_but_for_markdown_text(
        lang, english, generated, catalog):
    original = json.loads(english.read_text(encoding="utf-8"))
    text = generated.read_text(encoding="utf-8")
    made = json.loads(text)
    # the English files' JSON form, so a diff shows only the markdown that changed
    assert text == translations.notebook_json_text(made)
    assert len(made["cells"]) == len(original["cells"])
    for index, (ours, theirs) in enumerate(zip(made["cells"], original["cells"])):
        if theirs["cell_type"] == "markdown":
            ours, theirs = dict(ours, source=None), dict(theirs, source=None)
        assert ours == theirs, f"cell {index} ({theirs.get('id')}) differs"
    assert dict(made, cells=None) == dict(original, cells=None)  # metadata, nbformat


@pytest.mark.parametrize("lang, english, generated, catalog", GENERATED, ids=IDS)
def test_every_markdown_cell_is_translated_or_says_its_translation_is_outdated(
        lang, english, generated, catalog):
    entries = {entry.msgctxt: entry for entry in polib.pofile(str(catalog))
               if not entry.obsolete}
    english_cells = json.loads(english.read_text(encoding="utf-8"))["cells"]
    made = json.loads(generated.read_text(encoding="utf-8"))["cells"]
    for ours, theirs in zip(made, english_cells):
        if theirs["cell_type"] != "markdown" or not theirs["source"]:
            continue
        source, original = "".join(ours["source"]), "".join(theirs["source"])
        entry = entries.get(theirs["id"])
        note = translations.OUTDATED_NOTE[lang]
        if entry is not None and translations.is_translated(entry) \
                and entry.msgid == original:
            assert note not in source
            assert without_links(source) == without_links(entry.msgstr), theirs["id"]
        else:
            assert without_links(source) == without_links(f"{original}\n\n{note}"), \
                theirs["id"]


def without_links(text):
    """Markdown with link targets taken out (build rewrites them)."""
    return translations.LINK.sub("LINK", text)


def links(cell_text):
    return [match.group("target") or match.group("html_target")
            for match in translations.LINK.finditer(cell_text)]


def anchors(notebook_json):
    """The ids a ``#fragment`` link can reach: explicit ``id="..."`` attributes."""
    return {anchor for cell in notebook_json["cells"] if cell["cell_type"] == "markdown"
            for anchor in re.findall(r"\bid=\"([^\"]+)\"", "".join(cell["source"]))}


@pytest.mark.parametrize("lang, english, generated, catalog", GENERATED, ids=IDS)
def test_links_resolve_and_stay_within_the_language(lang, english, generated, catalog):
    made = json.loads(generated.read_text(encoding="utf-8"))
    in_language = translations.NOTEBOOKS_DIR / lang
    problems = []
    for cell in made["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        for target in links("".join(cell["source"])):
            if re.match(r"^[a-z]+:", target):
                continue  # a web address
            path, _, fragment = target.partition("#")
            resolved = (generated.parent / path).resolve() if path else generated
            if not resolved.exists():
                problems.append(f"{cell['id']}: {target} does not exist")
                continue
            if resolved.suffix == ".ipynb" and not resolved.is_relative_to(in_language):
                # only a notebook not (yet) in this language may be the English one
                english_one = resolved.relative_to(translations.NOTEBOOKS_DIR)
                if (in_language / english_one).exists():
                    problems.append(f"{cell['id']}: {target} leaves {lang}/")
            if fragment and resolved.suffix == ".ipynb" and fragment not in anchors(
                    json.loads(resolved.read_text(encoding="utf-8"))):
                problems.append(f"{cell['id']}: no id {fragment!r} in {path or 'it'}")
    assert not problems, "\n".join(problems)


def test_the_committed_notebooks_are_what_make_translations_writes(tmp_path):
    written = translations.build(out=tmp_path)
    assert written, "build wrote nothing"
    for lang in language.LANGUAGES:
        made = sorted(p.relative_to(tmp_path).as_posix()
                      for p in (tmp_path / lang).rglob("*.ipynb"))
        committed = sorted(p.relative_to(translations.NOTEBOOKS_DIR).as_posix()
                           for p in (translations.NOTEBOOKS_DIR / lang).rglob("*.ipynb")
                           if ".ipynb_checkpoints" not in p.parts)
        assert committed == made, "run `make translations` and commit notebooks/"
        for relative in made:
            assert (tmp_path / relative).read_bytes() == (
                translations.NOTEBOOKS_DIR / relative).read_bytes(), (
                f"notebooks/{relative} is not what `make translations` writes: run it")


def test_the_catalogs_follow_the_english_notebooks():
    # what `make translations`' update step would change, it has changed already
    for _, notebook, _, catalog in GENERATED:
        text = catalog.read_text(encoding="utf-8")
        synced = translations.synced(translations.load_catalog(catalog), notebook)
        assert str(synced) == text, (f"{catalog.relative_to(REPO_ROOT)} does not "
                                     f"follow {notebook.relative_to(REPO_ROOT)}: run "
                                     "`make translations`")


def test_no_catalog_has_an_outdated_or_untranslated_entry():
    counts, outdated = {}, []
    for lang, _, _, catalog in GENERATED:
        for entry in polib.pofile(str(catalog)):
            if entry.obsolete:
                continue
            kind = ("outdated (fuzzy)" if translations.FUZZY in entry.flags
                    else "untranslated" if not entry.msgstr else None)
            if kind:
                counts[lang, kind] = counts.get((lang, kind), 0) + 1
                outdated.append(f"{catalog.relative_to(REPO_ROOT)}, cell "
                                f"{entry.msgctxt}: {kind}")
    per_language = "; ".join(
        f"{lang}: " + ", ".join(f"{counts.get((lang, kind), 0)} {kind}"
                                for kind in ("outdated (fuzzy)", "untranslated"))
        for lang in sorted(language.LANGUAGES))
    print(per_language)  # `pytest -s` shows it when all is well
    assert not outdated, (f"{per_language}. "
                          "The English changed since these cells were translated: run "
                          "`make translations`, translate them in locales/<lang>/*.po "
                          "with a PO editor (their previous English is kept there for "
                          "comparison), and run `make translations` again:\n"
                          + "\n".join(outdated))


# --- The translations' Markdown
# -------------------------------------------------------------------


@pytest.mark.parametrize("catalog", sorted({c for *_, c in GENERATED}),
                         ids=lambda p: p.relative_to(LOCALES).as_posix())
def test_a_translation_keeps_the_english_markdown_structure(catalog):
    # a fuzzy entry translates its previous English, not the new one
    problems = [f"cell {entry.msgctxt}: {problem}"
                for entry in polib.pofile(str(catalog)) if entry.msgstr
                for problem in translations.markdown_problems(
                    entry.previous_msgid or entry.msgid, entry.msgstr)]
    assert not problems, "\n".join(problems)


# names the decks keep in Latin script (FORMAT.md of issue 33); the Hindi deck's "लोकल
# SGD" keeps "SGD"
LATIN_NAMES = ["PyTorch", "Trainer", "Accelerator", "Accelerate", "AdamW", "Adafactor",
               "SGD", "DDP", "ZeRO", "FSDP", "GPU", "CPU", "bfloat16", "float16",
               "float32", "NumPy", "JupyterLab", "Hugging Face", "DistilBERT",
               "Transformers"]


def latin_names(text):
    """The LATIN_NAMES that ``text`` writes outside code spans."""
    prose = translations.CODE_SPAN.sub("", text)
    return {name for name in LATIN_NAMES
            if re.search(rf"(?<!\w){re.escape(name)}(?!\w)", prose)}


def test_latin_names_are_found_in_prose_only():
    assert latin_names("`Trainer` with an Accelerator, on a GPU") == {"Accelerator",
                                                                   "GPU"}
    assert latin_names("लोकल SGD, AdamW'ın durumu, TrainerX") == {"SGD", "AdamW"}


@pytest.mark.parametrize("catalog", sorted({c for *_, c in GENERATED}),
                         ids=lambda p: p.relative_to(LOCALES).as_posix())
def test_a_translation_keeps_the_technical_names_in_latin_script(catalog):
    names = latin_names
    lost = [f"cell {entry.msgctxt}: {sorted(names(entry.msgid) - names(entry.msgstr))}"
            for entry in polib.pofile(str(catalog))
            if entry.msgstr and names(entry.msgid) - names(entry.msgstr)]
    assert not lost, "names the English has and the translation lost:\n" + "\n".join(
        lost)


ENGLISH = """## Exercise 1.2: `keep_b`

Measure with `measure_memory`; see [lesson 1](../01_gradient_checkpointing.ipynb).

| precision | bytes |
|---|---|
| `float32` | 4 |

<details><summary>Under the hood: why</summary>

Text <a id="why"></a>
</details>"""


@pytest.mark.parametrize("broken, problem", [
    (ENGLISH.replace("`measure_memory`", "measure_memory"), "code spans differ"),
    (ENGLISH.replace("`keep_b`", "`keep_B`"), "code spans differ"),
    (ENGLISH.replace("../01_gradient_checkpointing.ipynb", "../01.ipynb"),
     "link targets differ"),
    (ENGLISH.replace("| `float32` | 4 |", "| `float32` | 4 | 32 |"), "tables differ"),
    (ENGLISH.replace("|---|---|\n", ""), "tables differ"),
    (ENGLISH.replace("## Exercise", "### Exercise"), "headings differ"),
    (ENGLISH.replace("</summary>\n\n", "</summary>\n"), "no blank line"),
    (ENGLISH.replace('id="why"', 'id="neden"'), "HTML ids or targets differ"),
    (ENGLISH.replace("</details>", ""), "HTML tags differ"),
], ids=["lost-code-span", "changed-code-span", "link-target", "extra-column",
        "lost-table-row", "heading-level", "summary-blank-line", "anchor-id",
        "lost-tag"])
def test_the_markdown_check_catches_each_kind_of_broken_translation(broken, problem):
    found = translations.markdown_problems(ENGLISH, broken)
    assert any(p.startswith(problem) for p in found), found
    assert translations.markdown_problems(ENGLISH, ENGLISH) == []


# --- Glossaries
# -----------------------------------------------------------------------------------


@pytest.mark.parametrize("lang", sorted(language.LANGUAGES))
def test_each_glossary_quotes_its_seed_deck(lang):
    rows = translations.read_glossary(LOCALES / lang / "glossary.tsv")[1:]
    assert rows, "an empty glossary"
    decks = sorted(SEEDS.glob(SEED_DECK[lang]))
    if not decks:
        pytest.skip(f"the seed decks are not beside the repository ({SEEDS})")
    deck = " ".join(path.read_text(encoding="utf-8") for path in decks).casefold()
    # the glossary gives a word's dictionary form, the deck inflects it (Turkish
    # "verimlilik", the deck's "verimliliği"): each word, but its last letter, begins
    # a word of the deck
    def in_deck(term):
        return all(re.search(r"(?<!\w)" + re.escape(word[:-1] if len(word) > 3
                                                     else word), deck)
                   for word in term.casefold().split())
    missing = [row for row in rows if row[2] == "deck" and not in_deck(row[1])]
    assert not missing, f"said to be the deck's words, but not in it: {missing}"


# --- update and build on a notebook of the test's own
# ----------------------------------------------


@pytest.fixture
def small_course(tmp_path, monkeypatch):
    """A notebooks/ folder of two notebooks, a Hindi catalog for the first, and
    tools/translations.py pointed at them."""
    import nbformat

    notebooks, locales = tmp_path / "notebooks", tmp_path / "locales"
    (notebooks / "practice").mkdir(parents=True)
    lesson = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# Title\n\nSee [practice](practice/01_p.ipynb)."
                                      , id="title"),
        nbformat.v4.new_code_cell("x = 1", id="code"),
        nbformat.v4.new_markdown_cell("Second **cell**.", id="second"),
    ])
    nbformat.write(lesson, notebooks / "01_lesson.ipynb")
    nbformat.write(nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("Back to [the lesson](../01_lesson.ipynb).",
                                      id="p")]), notebooks / "practice" / "01_p.ipynb")
    monkeypatch.setattr(translations, "NOTEBOOKS_DIR", notebooks)
    monkeypatch.setattr(translations, "LOCALES_DIR", locales)
    translations.init("hi", [notebooks / "01_lesson.ipynb"], locales)
    path = locales / "hi" / "01_lesson.po"
    catalog = translations.load_catalog(path)
    for entry in catalog:
        entry.msgstr = {"title": "# शीर्षक\n\nदेखें [अभ्यास](practice/01_p.ipynb)।",
                        "second": "दूसरा **सेल**।"}[entry.msgctxt]
    catalog.save(str(path))
    return notebooks, locales, lesson, path


def entries(path):
    return {entry.msgctxt: entry for entry in translations.load_catalog(path)}


def test_update_marks_changed_english_fuzzy_adds_new_cells_and_keeps_removed_ones(
        small_course):
    import nbformat

    notebooks, locales, lesson, path = small_course
    assert translations.update(locales) == []  # nothing changed
    lesson.cells[2].source = "Second **cell**, changed."
    lesson.cells[0:1] = [nbformat.v4.new_markdown_cell("New.", id="new")]
    nbformat.write(lesson, notebooks / "01_lesson.ipynb")
    assert translations.update(locales) == [path]
    found = entries(path)
    assert found["second"].flags == ["fuzzy"]
    assert found["second"].previous_msgid == "Second **cell**."
    assert found["second"].msgid == "Second **cell**, changed."
    assert found["second"].msgstr == "दूसरा **सेल**।"
    assert found["new"].msgstr == "" and not found["new"].flags
    assert found["title"].obsolete and found["title"].msgstr.startswith("# शीर्षक")
    assert translations.counts(translations.load_catalog(path)) == {
        "translated": 0, "fuzzy": 1, "untranslated": 1, "obsolete": 1}
    # the English goes back: the translation is current again
    lesson.cells[2].source = "Second **cell**."
    nbformat.write(lesson, notebooks / "01_lesson.ipynb")
    translations.update(locales)
    assert not entries(path)["second"].flags


def test_build_shows_the_english_and_a_note_while_a_translation_is_outdated(
        small_course, tmp_path):
    import nbformat

    notebooks, locales, lesson, path = small_course
    out = tmp_path / "out"
    translations.build(out, locales)
    made = json.loads((out / "hi" / "01_lesson.ipynb").read_text())
    assert made["cells"][2]["source"] == ["दूसरा **सेल**।"]
    # no Hindi practice notebook: its link leads to the English one
    assert "](../practice/01_p.ipynb)" in "".join(made["cells"][0]["source"])
    assert not (out / "hi" / "practice").exists()
    lesson.cells[2].source = "Second **cell**, changed."
    nbformat.write(lesson, notebooks / "01_lesson.ipynb")
    translations.update(locales)
    translations.build(out, locales)
    made = json.loads((out / "hi" / "01_lesson.ipynb").read_text())
    assert "".join(made["cells"][2]["source"]) == ("Second **cell**, changed.\n\n"
                                                   + translations.OUTDATED_NOTE["hi"])
    # a Hindi practice notebook now: the link stays in Hindi
    translations.init("hi", [notebooks / "practice" / "01_p.ipynb"], locales)
    translations.build(out, locales)
    made = json.loads((out / "hi" / "01_lesson.ipynb").read_text())
    assert "](practice/01_p.ipynb)" in "".join(made["cells"][0]["source"])
    practice = json.loads((out / "hi" / "practice" / "01_p.ipynb").read_text())
    assert "](../01_lesson.ipynb)" in "".join(practice["cells"][0]["source"])


def test_import_reads_the_translators_files_and_marks_stale_ones_fuzzy(
        small_course, tmp_path):
    notebooks, locales, lesson, path = small_course
    source = tmp_path / "from_translators" / "tr"
    (source / "practice").mkdir(parents=True)
    (source / "glossary.tsv").write_text("english\ttranslation\tsource\n"
                                         "optimizer\teniyileyici\tdeck\n")
    (source / "01_lesson.json").write_text(json.dumps({
        "title": {"en": "# Title\n\nSee [practice](practice/01_p.ipynb).",
                  "text": "# Başlık\n\nBakın: [alıştırma](practice/01_p.ipynb)."},
        "second": {"en": "Second cell.", "text": "İkinci **hücre**."}}))
    written, problems = translations.import_translations(source.parent, locales)
    assert written == [locales / "tr" / "01_lesson.po"]
    found = entries(locales / "tr" / "01_lesson.po")
    assert translations.is_translated(found["title"])
    # the translator read other English than the notebook's
    assert found["second"].flags == ["fuzzy"]
    assert found["second"].previous_msgid == "Second cell."
    # and the Markdown it lost is named
    assert problems == []  # "**" is emphasis, not structure
    assert (locales / "tr" / "glossary.tsv").read_text().startswith("english\t")


def test_status_counts_each_language(small_course, capsys):
    notebooks, locales, lesson, path = small_course
    lines = translations.status(locales)
    assert lines[-1].startswith("hi (Hindi): 2 translated, 0 fuzzy, 0 untranslated, "
                                "0 obsolete; 1 notebooks, no catalog yet for 1: "
                                "practice/01_p")


def test_a_catalog_is_started_for_an_english_notebook_only(small_course):
    notebooks, locales, *_ = small_course
    with pytest.raises(SystemExit, match="not an English notebook"):
        translations.init("tr", [notebooks.parent / "elsewhere.ipynb"], locales)


def test_a_malformed_glossary_says_what_is_expected(tmp_path):
    path = tmp_path / "glossary.tsv"
    path.write_text("english\ttranslation\tsource\noptimizer\teniyileyici\n")
    with pytest.raises(SystemExit, match="line 2: expected english<TAB>translation"):
        translations.read_glossary(path)


# --- What pytest runs
# -----------------------------------------------------------------------------


def test_nbval_and_the_notebook_checks_run_the_english_notebooks_only():
    import test_notebooks

    root_conftest = (REPO_ROOT / "conftest.py").read_text()
    assert "collect_ignore" in root_conftest
    spec = {}
    exec(compile(root_conftest, "conftest.py", "exec"), spec)
    assert sorted(spec["collect_ignore"]) == sorted(
        f"notebooks/{lang}" for lang in language.LANGUAGES)
    assert not [p for p in test_notebooks.NOTEBOOKS if p.relative_to(
        REPO_ROOT / "notebooks").parts[0] in language.LANGUAGES]
    # the only folders of notebooks/: practice/ and one per language
    folders = {p.name for p in (REPO_ROOT / "notebooks").iterdir() if p.is_dir()}
    assert folders - {".ipynb_checkpoints"} <= {"practice", *language.LANGUAGES}


def test_slides_and_handouts_are_made_in_each_language():
    build_slides = load_tool("build_slides")
    for lang in language.LANGUAGES:
        lessons = build_slides.TRANSLATED_LESSONS[lang]
        assert lessons == sorted(p for p in (REPO_ROOT / "notebooks" / lang).glob(
            "0[0-9]_*") if not p.stem.endswith("_lab"))
        assert lessons, f"no {lang} lesson to render"
    # Hindi decks carry a Devanagari font (a machine may have none), for Devanagari only
    css = build_slides.language_css("hi")
    assert "font-family: 'Noto Sans Devanagari'" in css and "U+0900-097F" in css
    assert build_slides.language_css("tr") == ""  # the theme's fonts have its letters


def test_the_tool_runs_from_the_command_line():
    result = subprocess.run([sys.executable, str(REPO_ROOT / "tools" /
                                                 "translations.py"), "status"],
                            capture_output=True, text=True, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr
    for lang, name in language.LANGUAGES.items():
        assert re.search(rf"^{lang} \({name}\): \d+ translated, \d+ fuzzy, "
                         r"\d+ untranslated", result.stdout, re.M), result.stdout


def id_prefix(notebook):
    """The prefix every cell id of ``notebook`` starts with: ``l01-``, ``l01lab-``,
    ``p01-`` (locales/README.md)."""
    number = notebook.name[:2]
    if notebook.parent.name == "practice":
        return f"p{number}-"
    return f"l{number}lab-" if notebook.stem.endswith("_lab") else f"l{number}-"


@pytest.mark.parametrize(
    "notebook", translations.english_notebooks(),
    ids=[translations.relative_notebook(nb) for nb in translations.english_notebooks()])
def test_every_cell_id_follows_the_one_scheme_translators_read(notebook):
    prefix = id_prefix(notebook)
    wrong = [cell["id"] for cell in json.loads(notebook.read_text("utf-8"))["cells"]
             if not re.fullmatch(re.escape(prefix) + r"[a-z0-9]+(-[a-z0-9]+)*",
                                 cell["id"])]
    assert not wrong, (f"{notebook.name}: cell ids {wrong[:5]} do not start with "
                       f"{prefix!r} (locales/README.md); rename them and their "
                       "catalogs' msgctxt")
