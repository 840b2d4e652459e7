"""The verdicts every practice check prints, and the tools the checks share (lessons 01-04).

Every ``check_...`` function prints one verdict in plain words and returns nothing:

    Exercise 1.2: correct. B was kept ...
    Exercise 1.2: not quite. B (the matrix multiply) ran again in backward ... Hint: ...
    Exercise 1.2: not done yet. Replace each `...` in keep_expensive with your code ...

It never raises for a wrong or unfinished answer: an exception from the learner's code is
reported as one sentence, not a traceback. An exception in the check's own code is not the
learner's mistake: the verdict then says that the check itself failed, where, and whom to tell:

    Exercise 1.2: the check itself failed. This is a bug in the check, not in your answer: ...

A check checks what the answer does (values, bytes, gradients, counted operations), not how the
code is spelled. Each checker also has a ``.verdict(...)`` method that returns the ``Verdict``
without printing, for the tests. A check hides no warning: ``explaining_warnings`` turns the ones
it understands into advice in the verdict and lets every other one through.
"""
import ast
import contextlib
import functools
import inspect
import re
import textwrap
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path

from helpers.paths import REPO_ROOT

CORRECT, WRONG, NOT_DONE = "correct", "not quite", "not done yet"
CHECK_FAILED = "the check itself failed"  # an exception in the checker's code: a bug to report, not a wrong answer
HELPERS_DIR = REPO_ROOT / "helpers"  # where the checks' code lives


@dataclass
class Verdict:
    """What a check says about one exercise: its status and a message in plain words."""

    exercise: str
    status: str  # CORRECT, WRONG, NOT_DONE or CHECK_FAILED
    message: str

    def __str__(self):
        first_word = self.message.split(" ", 1)[0]
        starts_with_a_name = "_" in first_word or "(" in first_word or "`" in first_word
        message = self.message if starts_with_a_name else self.message[:1].upper() + self.message[1:]
        return f"Exercise {self.exercise}: {self.status}. {message}"


class Wrong(Exception):
    """Raised by a judge: the answer is wrong; the message says what and gives a hint."""


class NotDone(Exception):
    """Raised by a judge: the answer still holds a `...` to fill in."""


def checker(exercise):
    """Turn ``judge(*answers) -> message`` into a check that prints a Verdict and never raises."""
    def decorate(judge):
        def verdict(*args, **kwargs):
            """The Verdict on these answers, returned, not printed (for the tests)."""
            try:
                return Verdict(exercise, CORRECT, judge(*args, **kwargs))
            except NotDone as reason:
                return Verdict(exercise, NOT_DONE, str(reason))
            except Wrong as reason:
                return Verdict(exercise, WRONG, str(reason))
            except Exception as error:  # the learner's arrive as Wrong (call_learner): this one is the check's own
                return Verdict(exercise, CHECK_FAILED, check_failure_report(error))

        @functools.wraps(judge)
        def check(*args, **kwargs):
            print(verdict(*args, **kwargs))

        check.verdict = verdict
        return check
    return decorate


def check_failure_report(error):
    """The message for an exception raised by the check's own code: what, where, and whom to tell."""
    return (f"this is a bug in the check, not in your answer: {describe_error(error)}, raised at "
            f"{where_raised(error)}. Please report it, with this message, to the course maintainers "
            "(in the course's issue tracker).")


def where_raised(error):
    """``path, line N`` of the innermost frame in the course's helpers (path relative to the repository).

    ``error`` was caught by a checker: its traceback starts at the checker's wrapper, which is skipped.
    A library's frame would not say which line of the check to fix; the helpers' frame that called it does.
    Without one (a judge defined elsewhere, as in the tests), the innermost frame.
    """
    frames = traceback.extract_tb(error.__traceback__)[1:]
    in_helpers = [frame for frame in frames if Path(frame.filename).resolve().is_relative_to(HELPERS_DIR)]
    frame = (in_helpers or frames)[-1]
    path = Path(frame.filename).resolve()
    shown = path.relative_to(REPO_ROOT).as_posix() if path.is_relative_to(REPO_ROOT) else frame.filename
    return f"{shown}, line {frame.lineno}"


@contextlib.contextmanager
def explaining_warnings(*explained):
    """Catch the warnings whose message holds one of the ``explained`` texts, for the verdict to explain.

    Yields the list of those warnings, filled when the block ends. Every other warning raised inside
    is shown afterwards exactly as it would have been without the check (the learner's filters decide):
    a check turns a warning into advice, it never hides one.
    """
    explaining, caught = [], []
    try:
        with warnings.catch_warnings(record=True) as caught:
            for text in explained:  # the check needs these even where the learner's filters would hide them
                warnings.filterwarnings("always", message=f".*{re.escape(text)}")
            yield explaining
    finally:
        for warning in caught:
            if any(text in str(warning.message) for text in explained):
                explaining.append(warning)
            else:  # it already passed the learner's filters: show it as Python would have
                warnings.showwarning(warning.message, warning.category, warning.filename, warning.lineno,
                                     warning.file, warning.line)


def describe_error(error):
    """``Type: first line of the message`` (or only the type), one line for a verdict."""
    message = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


def call_learner(function, *args, name=None, hints=(), **kwargs):
    """Call the learner's function; turn any exception into ``Wrong`` with a plain-words message.

    A function that still returns ``...`` is not done yet.
    ``hints`` pairs a text that may appear in the error (or the exception's type name) with a hint.
    """
    name = name or getattr(function, "__name__", "your function")
    try:
        result = function(*args, **kwargs)
    except (Wrong, NotDone):
        raise
    except Exception as error:
        described = describe_error(error)
        hint = next((h for pattern, h in hints if pattern in described), "run it on its own to see the full error.")
        raise Wrong(f"calling {name} raised {described}. Hint: {hint}") from None
    if result is Ellipsis:
        raise NotDone(f"{name} still returns `...`: replace each `...` in it with your code, run that cell, "
                      "then run this check again.")
    return result


def require_done(answer, name, what="your code"):
    """Raise NotDone while ``answer`` (a value, a container or a function) still holds a `...`."""
    if is_unfinished(answer):
        raise NotDone(f"replace each `...` in {name} with {what}, run that cell, then run this check again.")


def require_callable(answer, name):
    """Raise NotDone while ``answer`` holds a `...`, and Wrong if it is not a function."""
    require_done(answer, name)
    if not callable(answer):
        raise Wrong(f"{name} should be a function (def {name}(...): ...), but it is a {type(answer).__name__}.")


def is_unfinished(answer):
    """Whether ``answer`` (a value, a container or a function's source) still holds a `...` placeholder."""
    if answer is Ellipsis:
        return True
    if isinstance(answer, dict):
        return any(is_unfinished(v) for v in answer.values())
    if isinstance(answer, (list, tuple, set)):
        return any(is_unfinished(v) for v in answer)
    if inspect.isfunction(answer):
        return function_has_ellipsis(answer)
    return False


def function_has_ellipsis(function):
    """Whether the function's source holds a `...` placeholder (slicing such as x[..., 0] does not count)."""
    try:
        source = textwrap.dedent(inspect.getsource(function))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        return False  # no source to read (e.g. a lambda built at run time): judge it by what it does
    in_slices = {id(node) for sub in ast.walk(tree) if isinstance(sub, ast.Subscript)
                 for node in ast.walk(sub.slice)}
    return any(isinstance(node, ast.Constant) and node.value is Ellipsis and id(node) not in in_slices
               for node in ast.walk(tree))


def whole_number(value, name):
    """``value`` as an int, or Wrong if it is not a whole number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise Wrong(f"{name} should be a whole number, but it is {value!r}.")
    return int(value)
