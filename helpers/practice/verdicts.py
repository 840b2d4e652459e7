"""The verdicts every practice check prints, and the tools the checks share (lessons
01-05).

Every ``check_...`` function prints one verdict in plain words and returns nothing:

    Exercise 1.2: correct. B was kept ...
    Exercise 1.2: not quite. B (the matrix multiply) ran again in backward ... Hint: ...
    Exercise 1.2: not done yet. Replace each `...` in keep_expensive with your code ...

It never raises for a wrong or unfinished answer: an exception from the learner's code
is reported as one sentence, not a traceback. An exception in the check's own code is
not the learner's mistake: the verdict then says that the check itself failed, where,
and whom to tell:

    Exercise 1.2: the check itself failed. This is a bug in the check, not in your
    answer: ...

A check checks what the answer does (values, bytes, gradients, counted operations), not
how the code is spelled. Each checker also has a ``.verdict(...)`` method that returns
the ``Verdict`` without printing, for the tests. A check hides no warning:
``explaining_warnings`` turns the ones it understands into advice in the verdict and
lets every other one through.
"""
import contextlib
import functools
import math
import operator

# shared with the practice core, which replaces this module check by check
from helpers.practice.core import (  # noqa: F401 (imported from here by the checks)
    CHECK_FAILED,
    CORRECT,
    NOT_DONE,
    WRONG,
    NotDone,
    Verdict,
    Wrong,
    check_failure_report,
    describe_error,
    explaining_warnings,
    is_unfinished,
    short_repr,
    where_raised,
)


def checker(exercise):
    """Turn ``judge(*answers) -> message`` into a check that prints a Verdict and never
    raises."""
    def decorate(judge):
        def verdict(*args, **kwargs):
            """The Verdict on these answers, returned, not printed (for the tests)."""
            try:
                return Verdict(exercise, CORRECT, judge(*args, **kwargs))
            except NotDone as reason:
                return Verdict(exercise, NOT_DONE, str(reason))
            except Wrong as reason:
                return Verdict(exercise, WRONG, str(reason))
            # the learner's arrive as Wrong (call_learner): this one is the check's own
            except Exception as error:
                return Verdict(exercise, CHECK_FAILED, check_failure_report(error))

        @functools.wraps(judge)
        def check(*args, **kwargs):
            print(verdict(*args, **kwargs))

        check.verdict = verdict
        return check
    return decorate










def call_learner(function, *args, name=None, hints=(), **kwargs):
    """Call the learner's function; turn any exception into ``Wrong`` with a plain-words
    message.

    A function that still returns ``...`` is not done yet.
    ``hints`` pairs a text that may appear in the error (or the exception's type name)
    with a hint.
    """
    name = name or getattr(function, "__name__", "your function")
    try:
        result = function(*args, **kwargs)
    except (Wrong, NotDone):
        raise
    except Exception as error:
        described = describe_error(error)
        hint = next((h for pattern, h in hints if pattern in described), "run it on "
                                                                         "its own to "
                                                                         "see the "
                                                                         "full error.")
        raise Wrong(f"calling {name} raised {described}. Hint: {hint}") from None
    if result is Ellipsis:
        raise NotDone(f"{name} still returns `...`: replace each `...` in it with "
                      "your code, run that cell, "
                      "then run this check again.")
    return result


def require_done(answer, name, what="your code"):
    """Raise NotDone while ``answer`` (a value, a container or a function) still holds a
    `...`."""
    if is_unfinished(answer):
        raise NotDone(f"replace each `...` in {name} with {what}, run that cell, then "
                      "run this check again.")


def require_callable(answer, name):
    """Raise NotDone while ``answer`` holds a `...`, and Wrong if it is not a
    function."""
    require_done(answer, name)
    if not callable(answer):
        raise Wrong(f"{name} should be a function (def {name}(...): ...), but it is a "
                    f"{type(answer).__name__}.")






def whole_number(value, name):
    """``value`` as an int, or Wrong, saying what it is instead, unless it is a whole
    number.

    A whole number is anything integral (a Python or NumPy integer, anything with
    ``__index__`` such as a 0-dimensional integer tensor or array) or a real number
    equal to an int (5.0, np.float64(5.0), a 0-dimensional float tensor): a learner may
    count with NumPy or PyTorch. A truth value, nan, an infinity, a fraction, a tensor
    of several values, one on the meta device, or anything else is the answer's mistake,
    so Wrong with a hint, never an exception that would read as the check's own failure.
    """
    said = f"{name} should be a whole number, but it is {short_repr(value)}"
    if isinstance(value, bool) or str(getattr(value, "dtype", "")) in ("bool",
                                                                       "torch.bool"):
        raise Wrong(f"{said}, a truth value. Hint: return the count itself (an int).")
    if getattr(value, "is_meta", False) is True:
        raise Wrong(f"{said}, a tensor on PyTorch's meta device: it has a shape and a "
                    "dtype but no value. "
                    "Hint: compute the number with Python ints (e.g. "
                    "math.prod(shape)), not with tensors.")
    dimensions = getattr(value, "ndim", 0)
    if isinstance(dimensions, int) and dimensions > 0:
        raise Wrong(f"{said}, of type {type(value).__name__} and shape "
                    f"{tuple(value.shape)}. Hint: return one "
                    "number; .item() gives the number in a 0-dimensional "
                    "tensor or array.")
    # integral: int, NumPy integers, 0-d integer tensors and arrays
    with contextlib.suppress(Exception):
        return operator.index(value)
    if isinstance(value, (str, bytes)) or not hasattr(type(value), "__float__"):
        raise Wrong(f"{said}, of type {type(value).__name__}. Hint: return a "
                    "number (an int).")
    if type(value).__module__.startswith("torch") and callable(
        getattr(value, "detach", None)
    ):
        # a tensor that requires grad converts with a warning that is not the learner's
        value = value.detach()
    try:
        number = float(value)
    except Exception as error:  # e.g. a complex number: not a count either
        raise Wrong(f"{said}, which is not a real number ({describe_error(error)}). "
                    "Hint: return an int.") from None
    if math.isnan(number):
        raise Wrong(f"{said}, which is not a number. Hint: nan comes from 0 / 0, inf "
                    "- inf or a nan in what the "
                    "code reads; a count made of whole numbers is never nan.")
    if math.isinf(number):
        raise Wrong(f"{said}, which is infinite. Hint: an infinity comes from a "
                    "division by zero or a float "
                    "overflow; count with Python ints, which never overflow.")
    if not number.is_integer():
        raise Wrong(f"{said}. Hint: a count is whole; where it comes from a division "
                    "(/), decide whether it "
                    "rounds up (math.ceil) or down (//).")
    return int(number)




def on_one_thread(judge):
    """Run a judge on one CPU thread, and give the learner back their thread count
    after.

    Shared by the practice checks of every lesson. They count bytes and operations on
    tiny tensors, never time: threads only add overhead there, and on a busy machine
    threads that wait for each other made a check ten times slower.
    """
    import torch  # here, not at the top: the verdicts themselves need no torch

    @functools.wraps(judge)
    def judged_on_one_thread(*args, **kwargs):
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return judge(*args, **kwargs)
        finally:
            torch.set_num_threads(threads)

    return judged_on_one_thread
