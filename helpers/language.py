"""The learner's language, and the practice checks' verdicts in it (introduced in the
practice notebooks of lessons 01-05, and in 00_start_here's translations).

The course is in English, Hindi and Turkish: `make translations` writes the Hindi and
Turkish notebooks into ``notebooks/hi/`` and ``notebooks/tr/``, with the English code
cells byte for byte. So the code cannot say which language the learner reads; the
folder the notebook runs in does: Jupyter, nbconvert and nbval start a notebook's
kernel in the notebook's folder, ``notebooks/hi/practice`` for a Hindi practice
notebook. ``verdict_line`` writes a practice check's verdict in that language: the
verdict word, "Exercise", "Hint:" and the fixed sentences of the checks; what a check
measured, and its own wording of a mistake, stay as the check wrote them.
"""
import os
import re
from pathlib import Path

ENGLISH = "en"
# the translated languages: a folder of notebooks/ each
LANGUAGES = {"hi": "Hindi", "tr": "Turkish"}

# The four verdicts (helpers/practice/core.py: CORRECT, WRONG, NOT_DONE,
# CHECK_FAILED) and the word "Exercise", as the translated practice notebooks write them
VERDICT_WORDS = {
    "hi": {"correct": "सही", "not quite": "पूरी तरह नहीं",
           "not done yet": "अभी किया नहीं गया",
           "the check itself failed": "जाँच ख़ुद विफल हो गई", "Exercise": "अभ्यास"},
    "tr": {"correct": "doğru", "not quite": "tam değil",
           "not done yet": "henüz yapılmadı",
           "the check itself failed": "kontrolün kendisi başarısız oldu",
           "Exercise": "Alıştırma"},
}

# The checks' fixed sentences (helpers/practice/core.py), as regular expressions
# over the English message, and their translations; the named parts (a function's
# name, an error, a place in the code) are kept as they are.
_NOT_DONE_RETURNS = re.compile(
    r"(?P<name>\S+) still returns `\.\.\.`: replace each `\.\.\.` in it with your "
    r"code, run that cell, then run this check again\.")
_NOT_DONE_REPLACE = re.compile(
    r"[Rr]eplace each `\.\.\.` in (?P<name>.+?) with your code, run that cell, then "
    r"run this check again\.")
_CHECK_BUG = re.compile(
    r"[Tt]his is a bug in the check, not in your answer: (?P<error>.+), raised at "
    r"(?P<where>.+?)\. Please report it, with this message, to the course maintainers "
    r"\(in the course's issue tracker\)\.", re.S)
# the learner's error is ``Type: its first sentence``; what follows is the hint of the
# mistake it made (": "), else "Hint: " and what to try
_ERROR = r"(?P<error>\w+(?:: (?:(?!: ).)+?)?)"
_CALLING_RAISED = re.compile(rf"[Cc]alling (?P<name>\S+) raised {_ERROR}\. Hint: ")
_CALLING_RAISED_MISTAKE = re.compile(rf"[Cc]alling (?P<name>\S+) raised {_ERROR}: ")
_HINT = re.compile(r"\bHint: ")

FIXED_PHRASES = {
    "hi": [
        (_NOT_DONE_RETURNS, "{name} अब भी `...` लौटाता है: उसमें हर `...` की जगह अपना "
                            "कोड लिखें, वह सेल चलाएँ, फिर यह जाँच दोबारा चलाएँ।"),
        (_NOT_DONE_REPLACE, "{name} में हर `...` की जगह अपना कोड लिखें, वह सेल चलाएँ, "
                            "फिर यह जाँच दोबारा चलाएँ।"),
        (_CHECK_BUG, "यह जाँच के कोड की गड़बड़ी है, आपके उत्तर की नहीं: {error}, {where} "
                     "पर। कृपया यह संदेश कोर्स के रखवालों को भेजें (कोर्स के issue "
                     "tracker में)।"),
        (_CALLING_RAISED, "{name} को चलाने पर {error} आया। संकेत: "),
        (_CALLING_RAISED_MISTAKE, "{name} को चलाने पर {error} आया: "),
        (_HINT, "संकेत: "),
    ],
    "tr": [
        (_NOT_DONE_RETURNS, "{name} hâlâ `...` döndürüyor: içindeki her `...` yerine "
                            "kodunuzu yazın, o hücreyi çalıştırın, sonra bu kontrolü "
                            "yeniden çalıştırın."),
        (_NOT_DONE_REPLACE, "{name} içindeki her `...` yerine kodunuzu yazın, o "
                            "hücreyi çalıştırın, sonra bu kontrolü yeniden "
                            "çalıştırın."),
        (_CHECK_BUG, "Bu, cevabınızdaki değil kontrolün kendisindeki bir hata: "
                     "{error}, şurada: {where}. Lütfen bu mesajla birlikte kurs "
                     "sorumlularına bildirin (kursun issue tracker'ında)."),
        (_CALLING_RAISED, "{name} çağrılınca {error} oluştu. İpucu: "),
        (_CALLING_RAISED_MISTAKE, "{name} çağrılınca {error} oluştu: "),
        (_HINT, "İpucu: "),
    ],
}


def learner_language(folder=None):
    """The language of the notebook running in ``folder`` (default: the working
    directory): ``"hi"`` in ``notebooks/hi`` or ``notebooks/hi/practice``, likewise
    ``"tr"``, else ``"en"``."""
    parts = Path(folder or os.getcwd()).parts
    if parts and parts[-1] == "practice":
        parts = parts[:-1]
    if len(parts) >= 2 and parts[-2] == "notebooks" and parts[-1] in LANGUAGES:
        return parts[-1]
    return ENGLISH


def translate_message(message, language):
    """A check's message with its fixed sentences in ``language``; the rest as it
    is."""
    for pattern, template in FIXED_PHRASES.get(language, []):
        message = pattern.sub(
            lambda match, template=template: template.format(**match.groupdict()),
            message)
    return message


def verdict_line(exercise, status, message, language=None):
    """``Exercise 1.2: correct. <message>`` in ``language`` (default: the learner's,
    ``learner_language()``)."""
    language = language or learner_language()
    if language == ENGLISH:
        return f"Exercise {exercise}: {status}. {message}"
    words = VERDICT_WORDS[language]
    return (f"{words['Exercise']} {exercise}: {words[status]}. "
            f"{translate_message(message, language)}")
