"""The practice core (lessons 01-06): ``check`` judges an answer by its ``Exercise``."""
import ast
import contextlib
import functools
import inspect
import math
import numbers
import re
import textwrap
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from helpers.language import verdict_line
from helpers.paths import REPO_ROOT
from helpers.random_state import global_random_state_kept

CORRECT, WRONG, NOT_DONE = "correct", "not quite", "not done yet"
CHECK_FAILED = "the check itself failed"  # a bug in the check, not a wrong answer
AGAIN = "with your code, run that cell, then run this check again."  # not done yet
# practices 3 and 6: a collective one process never joins fails in seconds, not 60
COLLECTIVE_TIMEOUT_S = 6
NEVER_JOINED = "RuntimeError: a collective timed out, as a process never joined it"
UNITS = {"GiB": 2**30, "GB": 10**9, "MiB": 2**20, "MB": 10**6, "KiB": 2**10,
         "kB": 10**3}.items()  # in_units: bytes given in GiB, MB...


def never_joined(error):
    """A worker's traceback in one line: NEVER_JOINED, or its last ``Type: message``."""
    if re.search("timed? ?out|by peer|gloo/transport|signalexception|sigabrt", error,
                 re.IGNORECASE):  # gloo's wait, or a peer's failure: one never came
        return NEVER_JOINED
    lines = error.strip().splitlines() or [""]
    return next((line for line in lines[::-1] if re.match(r"\w+(Error|Exception)\b",
                                                          line)), lines[-1])


@dataclass
class Verdict:
    """What a check says about one exercise: its status and a message in plain words."""

    exercise: str
    status: str  # CORRECT, WRONG, NOT_DONE or CHECK_FAILED
    message: str

    def __str__(self):  # in the notebook's language: Hindi in notebooks/hi/practice
        message = self.message
        if not any(mark in message.split(" ", 1)[0] for mark in "_(`"):  # not a name
            message = message[:1].upper() + message[1:]
        return verdict_line(self.exercise, self.status, message)


class Wrong(Exception):
    """Raised by a measure: the answer is wrong; the message says what, with a hint."""


class NotDone(Exception):
    """Raised by a measure: the answer still holds a `...` to fill in."""


@dataclass(frozen=True)
class Raised:  # the outcome of an answer that raised: ``Type: its first sentence``
    error: str
    where: str = field(default="", compare=False)  # path, line: for the check's bugs


def same_values(got, expected, rel=1e-6, abs_=1e-9):
    """Whether two outcomes agree: numbers and tensors within ``rel``/``abs_``."""
    same = close(rel, abs_)
    if hasattr(got, "is_floating_point") and hasattr(expected, "is_floating_point"):
        return (got.shape == expected.shape and got.dtype == expected.dtype
                and got.float().allclose(expected.float(), rel, abs_, equal_nan=True))
    if isinstance(got, dict) and isinstance(expected, dict):
        return got.keys() == expected.keys() and all(same(got[k], expected[k])
                                                     for k in got)
    if isinstance(got, (list, tuple)) and isinstance(expected, (list, tuple)):
        return len(got) == len(expected) and all(map(same, got, expected))
    if isinstance(got, numbers.Real) and isinstance(expected, numbers.Real):
        return (math.isclose(got, expected, rel_tol=rel, abs_tol=abs_)
                or (math.isnan(got) and math.isnan(expected)))
    return got == expected


def close(rel=1e-6, abs_=1e-9):  # an Exercise's ``same``, with these tolerances
    return functools.partial(same_values, rel=rel, abs_=abs_)


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: a cache key
class Exercise:
    """One exercise: how to measure an answer, the right one, the usual wrong ones."""

    number: str  # "5.4"
    measure: Callable  # measure(answer, config) -> outcome; runs the answer
    intended: Any  # the right answer, the same kind of thing the learner gives
    mistakes: Sequence = ()  # (hint, wrong answer as a learner writes it)
    configs: Sequence = (None,)  # >= 2 where the answer is a function
    describe: Any = ""  # no mistake matched: (got, expected, config) -> str, or a hint
    label: str = "{}"  # a configuration in words, e.g. "max_grad_norm={}"
    same: Callable = same_values  # tolerance from the gap between right and wrong
    correct: Any = "it does what the intended answer does."  # or (got, config) -> str
    name: str = "your answer"  # what the learner named it, for the messages
    error_hints: Sequence = ()  # (text in an error, hint) for errors no mistake makes


def checker(exercise):
    """A check called like ``named``: it prints the Verdict; ``.verdict`` returns it."""
    def decorate(named):
        def verdict(*args, **kwargs):
            given = [*inspect.signature(named).bind(*args, **kwargs).arguments.values()]
            return check(exercise, tuple(given) if len(given) > 1 else given[0])
        show = functools.wraps(named)(
            lambda *args, **kwargs: print(verdict(*args, **kwargs)))
        show.verdict = verdict
        return show
    return decorate


def check(exercise, answer):
    """The Verdict on ``answer``, on one thread, the learner's random numbers kept."""
    try:
        if is_unfinished(answer):
            raise NotDone(f"replace each `...` in {exercise.name} {AGAIN}")
        with one_thread(), global_random_state_kept():
            return Verdict(exercise.number, *judge(exercise, answer))
    except (NotDone, Wrong) as why:
        return Verdict(exercise.number, WRONG if isinstance(why, Wrong) else NOT_DONE,
                       str(why))
    except Exception as error:  # the check's own: the learner's arrive as Raised
        return Verdict(exercise.number, CHECK_FAILED, (
            f"this is a bug in the check, not in your answer: {describe_error(error)}, "
            f"raised at {getattr(error, 'where', '') or where_raised(error)}. Please "
            "report it, with this message, to the course maintainers (in the course's "
            "issue tracker)."))


def judge(exercise, answer):
    """(status, message); where the answer differs, the hint of the mistake it makes."""
    configs, mistakes = range(len(exercise.configs)), enumerate(exercise.mistakes)
    known = {"intended": exercise.intended} | {m: wrong for m, (_, wrong) in mistakes}
    which = next((which for which, listed in known.items() if listed is answer), None)
    got = [outcome(exercise, answer, exercise.configs[i]) if which is None  # anew
           else cached_outcome(exercise, which, i) for i in configs]
    expected = [cached_outcome(exercise, "intended", i) for i in configs]
    if bugs := [raised for raised in expected if isinstance(raised, Raised)]:
        bug = RuntimeError(f"the intended answer raised {bugs[0].error}")
        bug.where = bugs[0].where  # reported where the check's code raised
        raise bug
    first = next((i for i in configs if not agree(exercise, got[i], expected[i])), None)
    if first is None:  # a text ``correct`` is formatted with a dict outcome's parts
        correct, result = exercise.correct, expected[0]
        return CORRECT, (correct(result, exercise.configs[0]) if callable(correct) else
                         correct.format(**result if isinstance(result, dict) else {}))
    hint = next((hint for mistake, (hint, _) in enumerate(exercise.mistakes)
                 if all(agree(exercise, got[i], cached_outcome(exercise, mistake, i))
                        for i in configs)), None)
    got, expected, config = got[first], expected[first], exercise.configs[first]
    said = isinstance(got, Raised) and f"calling {exercise.name} raised {got.error}"
    if hint is not None:
        return WRONG, f"{said}: {hint}" if said else hint
    if said:
        return WRONG, f"{said}. Hint: " + next(
            (hint for text, hint in exercise.error_hints if text in got.error),
            "run it on its own to see the full error.")
    describe = exercise.describe if callable(exercise.describe) else functools.partial(
        differences, exercise)  # a text describe: the hint after what differs
    return WRONG, (in_units(got, expected, exercise.name)  # bytes in GiB, MB...
                   or describe(got, expected, config))


def agree(exercise, got, expected):
    """Whether two outcomes agree by ``exercise.same``; exceptions only if the same."""
    return (got == expected if Raised in (type(got), type(expected))
            else exercise.same(got, expected))


@functools.cache  # by identity: the intended answer and the mistakes never change
def cached_outcome(exercise, which, index):
    """The outcome of ``"intended"`` or mistake ``which`` on config ``index``, once."""
    answer = exercise.intended if which == "intended" else exercise.mistakes[which][1]
    try:
        return outcome(exercise, answer, exercise.configs[index])
    except Wrong as reason:  # a mistake the measure itself turns down
        return Raised(f"Wrong: {reason}", where_raised(reason))


def differences(exercise, got, expected, config):
    """Where and what differs (not the intended values: they may be the answer)."""
    def shown(key, value):  # tensors by name only: their values say nothing to read
        value = f"{value:.4g}" if isinstance(value, float) else short_repr(
            value, 160 if isinstance(value, str) else 60)  # a text: whole, as said
        return key if "tensor(" in value else f"{key} {value}"

    in_words = exercise.label.format(*config if isinstance(config, tuple) else [config])
    where = f"with {in_words}, " if len(exercise.configs) > 1 else ""
    if isinstance(got, dict) and isinstance(expected, dict):
        parts = [shown(key, got[key]) for key in got if key not in expected
                 or not exercise.same(got[key], expected[key])]
        said = f"{where}what differs from the intended answer: {listed(parts)}."
    else:
        said = f"{where}{exercise.name} gave {shown('', got).strip()}."
    return said + (f" Hint: {exercise.describe}" if exercise.describe else "")


def outcome(exercise, answer, config):
    """``measure(answer, config)``; a learner's exception becomes a Raised outcome."""
    try:
        return exercise.measure(answer, config)
    except LearnerRaised as error:  # its context: the answer's own exception
        return Raised(str(error), error.__context__ and where_raised(error.__context__))


class LearnerRaised(Exception):  # raised by learner(): the learner's code raised
    pass


def learner(function, *args, **kwargs):
    """Call the learner's code: its exception in one line; ``...`` is not done yet."""
    try:
        result = function(*args, **kwargs)
    except (Wrong, NotDone, LearnerRaised):
        raise
    except Exception as error:  # its first sentence: the rest is a library's advice
        raise LearnerRaised(describe_error(error).split(".  ")[0].rstrip(".")) from None
    if result is Ellipsis:
        raise NotDone(f"{getattr(function, '__name__', 'your function')} still returns "
                      f"`...`: replace each `...` in it {AGAIN}")
    return result


def as_number(value, name="your answer", whole=False):
    """``value`` as an int or float from any number type, else Wrong with a hint."""
    said = f"{name} should be a {'whole ' if whole else ''}number, but it is"
    if isinstance(value, bool) or "bool" in str(getattr(value, "dtype", "")):
        raise Wrong(f"{said} {short_repr(value)}, a truth value. Hint: the number.")
    if shape := tuple(getattr(value, "shape", ())):
        raise Wrong(f"{said} of shape {shape}. Hint: one number (.item()).")
    with contextlib.suppress(Exception):
        return value.__index__()  # int, NumPy integers, 0-d integer tensors
    try:  # float, NumPy floats, Fraction, Decimal, 0-d float tensors; not a text
        number = (value.detach() if hasattr(value, "detach") else value).__float__()
    except Exception:
        raise Wrong(f"{said} {short_repr(value)}, of type {type(value).__name__}. "
                    "Hint: give a number.") from None
    if not math.isfinite(number):
        raise Wrong(f"{said} {number}: a division by zero or an overflow. Hint: "
                    "compute with Python numbers.")
    if whole and not number.is_integer():
        raise Wrong(f"{said} {number:g}. Hint: a count is whole: after a division, "
                    "decide whether it rounds up (math.ceil) or down (//).")
    return int(number) if whole else number


def as_numbers(value, name="your answer"):
    """A tuple of numbers from a tuple, list, 1-d array or tensor; else Wrong."""
    if isinstance(value, (dict, set)):  # named as a learner says; a text: as_number
        raise Wrong(f"{name} is a {type(value).__name__}, {short_repr(value, 60)}. "
                    "Hint: give the numbers in order, as a tuple: (first, second).")
    if isinstance(value, (tuple, list)) or len(getattr(value, "shape", "")) == 1:
        return tuple(as_number(item, f"each number of {name}") for item in value)
    return as_number(value, name)  # one number, judged as one


def in_units(got, expected, name="your answer"):
    """A sentence where ``got`` is ``expected``'s bytes in GiB, MB..., else ""."""
    pairs = [(got[k], e) for k, e in expected.items() if k in got] if isinstance(
        got, dict) else [(got, expected)]
    return next((f"{name} gave {unit}: the answer asks for bytes. Hint: 1 {unit} = "
                 f"{size:,} bytes." for unit, size in UNITS if all(isinstance(
                     g, numbers.Real) and math.isclose(g * size, e, rel_tol=1e-4)
                                                          for g, e in pairs)), "")


def returned(value, kind, name):
    """``value``, if the learner's ``name`` returned a ``kind``; else a form problem."""
    if not isinstance(value, kind):
        raise Wrong(f"{name} should return {kind.__name__}(...), but returned "
                    f"{type(value).__name__}.")
    return value


def listed(items):  # a; a and b; a, b and c; "" for none
    items = [str(item) for item in items]
    return ", ".join(items[:-1]) + " and " * (len(items) > 1) + "".join(items[-1:])


def short_repr(value, limit=80):
    """``repr(value)``, cut to ``limit`` characters (an answer may be anything)."""
    with contextlib.suppress(Exception):
        shown = repr(value)
        return shown if len(shown) <= limit else shown[:limit - 3] + "..."
    return f"a {type(value).__name__}"


def describe_error(error):
    """``Type: first line of the message`` (or only the type), one line."""
    return ": ".join([type(error).__name__, *str(error).strip().splitlines()[:1]])


def where_raised(error):
    """``path, line N`` of the innermost frame of the checks' code (else, innermost)."""
    frames = [(Path(frame.filename).resolve(), frame)
              for frame in traceback.extract_tb(error.__traceback__)]
    path, frame = ([(path, frame) for path, frame in frames if path.name != "core.py"
                    and path.is_relative_to(REPO_ROOT / "helpers")] or frames)[-1]
    shown = (path.relative_to(REPO_ROOT).as_posix() if path.is_relative_to(REPO_ROOT)
             else frame.filename)
    return f"{shown}, line {frame.lineno}"


def edited(function, *edits):
    """``function`` as a learner's near miss, defined anew: each edit ``(line, new)``
    or ``(line, new, levels)`` makes its line ``line`` (indentation aside) ``new``'s
    lines ("": cut), at its indentation, ``levels`` x 4 spaces deeper (-1: out)."""
    lines = textwrap.dedent(inspect.getsource(function)).splitlines()
    for line, new, *levels in edits:
        if line not in (texts := [text.strip() for text in lines]):
            raise ValueError(f"{function.__name__} has no line {line!r} to edit")
        at = texts.index(line)
        indent = " " * (len(lines[at]) - len(texts[at]) + 4 * sum(levels))
        lines[at:at + 1] = [indent + text for text in new.splitlines()]
    exec("\n".join(lines), namespace := dict(function.__globals__))
    return namespace[function.__name__]


def source_tree(function):
    """The syntax tree of ``function``'s source; None where there is none to read."""
    try:
        return ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError, SyntaxError):
        return None


def is_unfinished(answer):
    """Whether ``answer`` (a value, a container, a function's source) holds a `...`."""
    if isinstance(answer, (dict, list, tuple, set)):
        return any(map(is_unfinished, answer.values() if isinstance(answer, dict)
                       else answer))
    if not inspect.isfunction(answer):
        return answer is Ellipsis
    if (tree := source_tree(answer)) is None:
        return False  # no source to read: judge it by what it does
    in_slices = {id(node) for sub in ast.walk(tree) if isinstance(sub, ast.Subscript)
                 for node in ast.walk(sub.slice)}  # x[..., 0] is code, not a gap
    return any(isinstance(node, ast.Constant) and node.value is Ellipsis
               and id(node) not in in_slices for node in ast.walk(tree))


@contextlib.contextmanager
def explaining_warnings(*explained):
    """Warnings holding an ``explained`` text go in the list yielded; others show."""
    explaining, show = [], warnings.showwarning

    def caught(message, *where):  # the others already passed the learner's filters
        if any(text in str(message) for text in explained):
            return explaining.append(warnings.WarningMessage(message, *where))
        show(message, *where)

    with warnings.catch_warnings():
        for text in explained:  # needed even where the learner's filters hide them
            warnings.filterwarnings("always", message=f".*{re.escape(text)}")
        warnings.showwarning = caught
        yield explaining


@contextlib.contextmanager
def one_thread():
    """One CPU thread while a check runs (tiny tensors), the learner's count after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
