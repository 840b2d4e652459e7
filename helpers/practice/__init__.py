"""Friendly automatic checks for the practice notebooks in notebooks/practice/.

Every ``check_...`` function prints one verdict in plain words and returns nothing:

    Exercise 1.2: correct. B was kept ...
    Exercise 1.2: not quite. B (the matrix multiply) ran again in backward ... Hint: ...
    Exercise 1.2: not done yet. Replace each `...` in keep_expensive with your code ...

It never raises for a wrong or unfinished answer: an exception from the learner's code is
reported as one sentence, not a traceback. It checks what the answer does (values, bytes,
gradients, counted operations), not how the code is spelled. Each checker also has a
``.verdict(...)`` method that returns the ``Verdict`` without printing, for the tests.

One module per lesson: ``gradient_checkpointing`` (01), ``trainer_and_accelerator`` (02),
``local_sgd`` (03), ``adamw`` (04).
"""
import ast
import functools
import inspect
import textwrap
import warnings
from dataclasses import dataclass

CORRECT, WRONG, NOT_DONE = "correct", "not quite", "not done yet"


@dataclass
class Verdict:
    exercise: str
    status: str  # CORRECT, WRONG or NOT_DONE
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
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # the learner sees the verdict, not library warnings
                    return Verdict(exercise, CORRECT, judge(*args, **kwargs))
            except NotDone as reason:
                return Verdict(exercise, NOT_DONE, str(reason))
            except Wrong as reason:
                return Verdict(exercise, WRONG, str(reason))
            except Exception as error:  # an answer the judge did not foresee: still one sentence
                return Verdict(exercise, WRONG, f"checking your answer failed with {describe_error(error)}. "
                               "Hint: re-read the exercise, and run your cell on its own to see the full error.")

        @functools.wraps(judge)
        def check(*args, **kwargs):
            print(verdict(*args, **kwargs))

        check.verdict = verdict
        return check
    return decorate


def describe_error(error):
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
    require_done(answer, name)
    if not callable(answer):
        raise Wrong(f"{name} should be a function (def {name}(...): ...), but it is a {type(answer).__name__}.")


def is_unfinished(answer):
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
