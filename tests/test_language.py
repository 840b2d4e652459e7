"""The practice checks speak the notebook's language (helpers/language.py, issue 33):
the folder a notebook runs in (notebooks/hi/practice) gives the language, and a check's
verdict words and fixed sentences come out in it; what it measured stays as it is.
"""
import json

import pytest

from helpers import language
from helpers.paths import REPO_ROOT
from helpers.practice import verdicts


@pytest.mark.parametrize("folder, expected", [
    ("notebooks", "en"), ("notebooks/practice", "en"), ("notebooks/hi", "hi"),
    ("notebooks/hi/practice", "hi"), ("notebooks/tr/practice", "tr"),
    ("tr", "en"), ("somewhere/tr/practice", "en"), ("", "en")])
def test_the_learners_language_is_the_notebooks_folder(folder, expected):
    assert language.learner_language(REPO_ROOT / folder) == expected


def test_every_verdict_has_its_words_in_each_language():
    statuses = {verdicts.CORRECT, verdicts.WRONG, verdicts.NOT_DONE,
                verdicts.CHECK_FAILED}
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
                   if status in (verdicts.CORRECT, verdicts.WRONG, verdicts.NOT_DONE)
                   and word not in intro]
        assert not missing, f"{path.name} does not name {missing}"


def verdicts_in(folder, monkeypatch):
    """What a check prints, run in ``folder`` (the notebook's kernel's folder)."""
    folder.mkdir(parents=True, exist_ok=True)
    monkeypatch.chdir(folder)

    @verdicts.checker("1.2")
    def judge(answer):
        verdicts.require_done(answer, "keep_b")
        if answer == "bug":
            raise KeyError("state")
        if answer != 3:
            verdicts.call_learner(lambda: 1 / 0, name="keep_b",
                                  hints=[("ZeroDivision", "divide by the count.")])
        return "B was kept: 3 tensors, measured."

    return [str(judge.verdict(answer)) for answer in (..., 2, "bug", 3)]


# What each check prints in each language's folder: not done, wrong, check failed,
# correct (the start of each line)
PRINTED = {
    "notebooks/hi/practice": [
        "अभ्यास 1.2: अभी किया नहीं गया. keep_b में हर `...` की जगह अपना कोड लिखें, वह सेल "
        "चलाएँ, फिर यह जाँच दोबारा चलाएँ।",
        "अभ्यास 1.2: पूरी तरह नहीं. keep_b को चलाने पर ZeroDivisionError: division by "
        "zero आया। संकेत: divide by the count.",
        "अभ्यास 1.2: जाँच ख़ुद विफल हो गई. यह जाँच के कोड की गड़बड़ी है, आपके उत्तर की "
        "नहीं: KeyError: 'state', tests/test_language.py, line ",
        # what the check measured stays as the check wrote it
        "अभ्यास 1.2: सही. B was kept: 3 tensors, measured."],
    "notebooks/tr/practice": [
        "Alıştırma 1.2: henüz yapılmadı. keep_b içindeki her `...` yerine kodunuzu "
        "yazın, o hücreyi çalıştırın, sonra bu denetimi yeniden çalıştırın.",
        "Alıştırma 1.2: tam değil. keep_b çağrılınca ZeroDivisionError: division by "
        "zero oluştu. İpucu: divide by the count.",
        "Alıştırma 1.2: denetimin kendisi başarısız oldu. Bu, cevabınızdaki değil "
        "denetimin kendisindeki bir hata: KeyError: 'state', şurada: ",
        "Alıştırma 1.2: doğru. B was kept: 3 tensors, measured."],
    "notebooks/practice": [
        "Exercise 1.2: not done yet. Replace each `...` in keep_b with your code, run "
        "that cell, then run this check again.",
        "Exercise 1.2: not quite. Calling keep_b raised ZeroDivisionError: division by "
        "zero. Hint: divide by the count.",
        "Exercise 1.2: the check itself failed. This is a bug in the check, not in "
        "your answer: KeyError: 'state', raised at tests/test_language.py, line ",
        "Exercise 1.2: correct. B was kept: 3 tensors, measured."],
}


@pytest.mark.parametrize("folder", PRINTED)
def test_a_check_prints_its_verdict_in_the_language_of_its_folder(
        folder, tmp_path, monkeypatch):
    printed = verdicts_in(tmp_path / folder, monkeypatch)
    for line, expected in zip(printed, PRINTED[folder]):
        assert line.startswith(expected), line
    if folder != "notebooks/practice":
        assert not [line for line in printed if "Please report" in line
                    or "Hint:" in line], printed


@pytest.mark.parametrize("what, hindi, turkish", [
    ("a whole number", "एक पूर्ण संख्या लिखें", "yerine bir tam sayı yazın"),
    ("a number of bytes per parameter", "प्रति पैरामीटर बाइट्स की संख्या लिखें",
     "yerine parametre başına bayt sayısını yazın"),
    ("one of the names", "one of the names लिखें", "yerine one of the names yazın")])
def test_what_a_check_asks_for_is_said_in_the_language(what, hindi, turkish):
    with pytest.raises(verdicts.NotDone) as raised:
        verdicts.require_done(..., "prediction", what)
    for lang, expected in (("hi", hindi), ("tr", turkish)):
        line = language.verdict_line("1.1", verdicts.NOT_DONE, str(raised.value), lang)
        assert expected in line and "Replace" not in line, line


def test_a_function_left_unfinished_is_reported_in_the_language(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    def unfinished():
        return ...
    with pytest.raises(verdicts.NotDone) as raised:
        verdicts.call_learner(unfinished)
    line = language.verdict_line("2.1", verdicts.NOT_DONE, str(raised.value), "hi")
    assert line == ("अभ्यास 2.1: अभी किया नहीं गया. unfinished अब भी `...` लौटाता है: "
                    "उसमें हर `...` की जगह अपना कोड लिखें, वह सेल चलाएँ, फिर यह जाँच "
                    "दोबारा चलाएँ।")
