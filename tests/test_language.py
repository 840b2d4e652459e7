"""The practice checks speak the notebook's language (helpers/language.py, issue 33):
the folder a notebook runs in (notebooks/hi/practice) gives the language, and a check's
verdict words and fixed sentences come out in it; what it measured stays as it is.
"""
import json

import pytest

from helpers import language
from helpers.paths import REPO_ROOT
from helpers.practice.core import (
    CHECK_FAILED,
    CORRECT,
    NOT_DONE,
    WRONG,
    Exercise,
    NotDone,
    check,
    learner,
)


@pytest.mark.parametrize("folder, expected", [
    ("notebooks", "en"), ("notebooks/practice", "en"), ("notebooks/hi", "hi"),
    ("notebooks/hi/practice", "hi"), ("notebooks/tr/practice", "tr"),
    ("tr", "en"), ("somewhere/tr/practice", "en"), ("", "en")])
def test_the_learners_language_is_the_notebooks_folder(folder, expected):
    assert language.learner_language(REPO_ROOT / folder) == expected


def test_every_verdict_has_its_words_in_each_language():
    statuses = {CORRECT, WRONG, NOT_DONE, CHECK_FAILED}
    for lang in language.LANGUAGES:
        assert set(language.VERDICT_WORDS[lang]) == statuses | {"Exercise"}


@pytest.mark.parametrize("lang", sorted(language.LANGUAGES))
def test_the_translated_practice_notebooks_name_the_verdicts_the_checks_print(lang):
    # the first cell says which verdicts a check gives: the words the checks print
    practice = sorted((REPO_ROOT / "notebooks" / lang / "practice").glob(
        "*_practice.ipynb"))
    if not practice:
        pytest.skip(f"no {lang} practice notebook yet")
    for path in practice:
        intro = "".join(json.loads(path.read_text())["cells"][0]["source"])
        missing = [word for status, word in language.VERDICT_WORDS[lang].items()
                   if status in (CORRECT, WRONG, NOT_DONE)
                   and word not in intro]
        assert not missing, f"{path.name} does not name {missing}"


def unscaled(x):  # a mistake that raises
    raise AssertionError("No inf checks were recorded for this optimizer.")


KEEP_B = Exercise(
    number="1.2", name="keep_b", intended=lambda x: 3 * x,
    # a text for an answer: the check's own bug (a KeyError)
    measure=lambda answer, x: learner(answer, x) if callable(answer) else {}["state"],
    mistakes=[("you kept A. Hint: keep B.", unscaled)], configs=(1, 2),
    error_hints=[("ZeroDivision", "divide by the count.")],
    correct=lambda got, x: f"B was kept: {got} tensors, measured.")


def verdicts_in(folder, monkeypatch):
    """What a check prints, run in ``folder`` (the notebook's kernel's folder)."""
    folder.mkdir(parents=True, exist_ok=True)
    monkeypatch.chdir(folder)
    answers = (...,  # each on its own line: a lambda's source is its whole line
               lambda x: 1 / 0,
               unscaled, "bug", lambda x: x * 3)
    return [str(check(KEEP_B, answer)) for answer in answers]


# What each check prints in each language's folder: not done, wrong (an error no
# mistake makes; a listed mistake's error), check failed, correct (each line's start)
PRINTED = {
    "notebooks/hi/practice": [
        "अभ्यास 1.2: अभी किया नहीं गया. keep_b में हर `...` की जगह अपना कोड लिखें, वह सेल "
        "चलाएँ, फिर यह जाँच दोबारा चलाएँ।",
        "अभ्यास 1.2: पूरी तरह नहीं. keep_b को चलाने पर ZeroDivisionError: division by "
        "zero आया। संकेत: divide by the count.",
        "अभ्यास 1.2: पूरी तरह नहीं. keep_b को चलाने पर AssertionError: No inf checks "
        "were recorded for this optimizer आया: you kept A. संकेत: keep B.",
        "अभ्यास 1.2: जाँच ख़ुद विफल हो गई. यह जाँच के कोड की गड़बड़ी है, आपके उत्तर की "
        "नहीं: KeyError: 'state', tests/test_language.py, line ",
        # what the check measured stays as the check wrote it
        "अभ्यास 1.2: सही. B was kept: 3 tensors, measured."],
    "notebooks/tr/practice": [
        "Alıştırma 1.2: henüz yapılmadı. keep_b içindeki her `...` yerine kodunuzu "
        "yazın, o hücreyi çalıştırın, sonra bu kontrolü yeniden çalıştırın.",
        "Alıştırma 1.2: tam değil. keep_b çağrılınca ZeroDivisionError: division by "
        "zero oluştu. İpucu: divide by the count.",
        "Alıştırma 1.2: tam değil. keep_b çağrılınca AssertionError: No inf checks "
        "were recorded for this optimizer oluştu: you kept A. İpucu: keep B.",
        "Alıştırma 1.2: kontrolün kendisi başarısız oldu. Bu, cevabınızdaki değil "
        "kontrolün kendisindeki bir hata: KeyError: 'state', şurada: ",
        "Alıştırma 1.2: doğru. B was kept: 3 tensors, measured."],
    "notebooks/practice": [
        "Exercise 1.2: not done yet. Replace each `...` in keep_b with your code, run "
        "that cell, then run this check again.",
        "Exercise 1.2: not quite. Calling keep_b raised ZeroDivisionError: division by "
        "zero. Hint: divide by the count.",
        "Exercise 1.2: not quite. Calling keep_b raised AssertionError: No inf checks "
        "were recorded for this optimizer: you kept A. Hint: keep B.",
        "Exercise 1.2: the check itself failed. This is a bug in the check, not in "
        "your answer: KeyError: 'state', raised at tests/test_language.py, line ",
        "Exercise 1.2: correct. B was kept: 3 tensors, measured."],
}


@pytest.mark.parametrize("folder", PRINTED)
def test_a_check_prints_its_verdict_in_the_language_of_its_folder(
        folder, tmp_path, monkeypatch):
    printed = verdicts_in(tmp_path / folder, monkeypatch)
    assert len(printed) == len(PRINTED[folder])
    for line, expected in zip(printed, PRINTED[folder]):
        assert line.startswith(expected), line
    if folder != "notebooks/practice":
        assert not [line for line in printed if "Please report" in line
                    or "Hint:" in line], printed


def test_a_function_left_unfinished_is_reported_in_the_language(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    def unfinished():
        return Ellipsis  # no `...` in its source: found when it returns one
    with pytest.raises(NotDone) as raised:
        learner(unfinished)
    line = language.verdict_line("2.1", NOT_DONE, str(raised.value), "hi")
    assert line == ("अभ्यास 2.1: अभी किया नहीं गया. unfinished अब भी `...` लौटाता है: "
                    "उसमें हर `...` की जगह अपना कोड लिखें, वह सेल चलाएँ, फिर यह जाँच "
                    "दोबारा चलाएँ।")
