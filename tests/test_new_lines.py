"""Lesson 03's promise, tested: its ``train_loop`` is lesson 02's Accelerate loop plus
the lines marked ``# NEW``, as Accelerate's tests/test_examples.py diffs each example of
``examples/by_feature`` against its base script.

Both loops are read from the notebooks: lesson 02's from the cell that defines
``train_with_accelerator``, lesson 03's from the output of the cell that shows it. Lines
are compared as Python tokens (comments and wrapping aside) at their block depth.
Lesson 03's ``# NEW`` lines go, with their continuation lines; a removed ``with ...:``
takes its block's indentation with it. Of lesson 02's function, the loop is what runs
from ``model.train()`` to the ``return``; the set-up before it (the Accelerator made,
checkpointing switched on, ``prepare``) is the caller's in lesson 03. The names lesson
03 changes are the ones its docstring lists as ``old`` is ``new``.
"""
import difflib
import io
import re
import tokenize

import pytest

LESSON_2 = "notebooks/02_trainer_and_accelerator.ipynb"
LESSON_3 = "notebooks/03_local_sgd.ipynb"
EPOCH_LOOP = "for epoch in range ( epochs ) :"  # lesson 02's, as tokens
RENAMED = re.compile(r"``([^`]+)``(?: \([^)]*\))? is ``([^`]+)``")


def logical_lines(source):
    """``(depth, tokens, marked)`` per logical line: its block depth, its tokens joined
    by spaces, and whether a comment on one of its lines starts with ``# NEW``."""
    lines, depth, tokens, marked = [], 0, [], False
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.INDENT:
            depth += 1
        elif token.type == tokenize.DEDENT:
            depth -= 1
        elif token.type == tokenize.COMMENT:
            marked = marked or token.string.startswith("# NEW")
        elif token.type == tokenize.NL and not tokens:
            marked = False  # a comment on a line of its own marks nothing after it
        elif token.type == tokenize.NEWLINE:
            lines.append((depth, " ".join(tokens), marked))
            tokens, marked = [], False
        elif token.type not in (tokenize.NL, tokenize.ENDMARKER):
            tokens.append(token.string)
    return lines


def without_new_lines(lines):
    """``(depth, tokens)`` of the lines not marked NEW; a removed block header's block
    moves one level out."""
    kept, removed_headers = [], []
    for depth, code, marked in lines:
        while removed_headers and depth <= removed_headers[-1]:
            removed_headers.pop()
        if marked:
            if code.endswith(":"):
                removed_headers.append(depth)
            continue
        kept.append((depth - len(removed_headers), code))
    return kept


def function_lines(source, name):
    """The logical lines of function ``name`` in ``source``, its ``def`` line first."""
    lines = logical_lines(source)
    start = next(i for i, (depth, code, _) in enumerate(lines)
                 if depth == 0 and code.startswith(f"def {name} ("))
    end = next((i for i in range(start + 1, len(lines)) if lines[i][0] == 0),
               len(lines))
    return lines[start:end]


def lesson_2_loop(cell_source, renames):
    """Lesson 02's Accelerate loop: from ``model.train()`` to the ``return``, its epochs
    made one pass, lesson 03's renames applied."""
    lines = function_lines(cell_source, "train_with_accelerator")
    codes = [code for _, code, _ in lines]
    start = codes.index("model . train ( )")
    end = next(i for i, (depth, code, _) in enumerate(lines)
               if depth == 1 and code.startswith("return "))
    loop, epoch_depth = [], None
    for depth, code, _ in lines[start:end]:
        if epoch_depth is not None and depth <= epoch_depth:
            epoch_depth = None
        if code == EPOCH_LOOP:
            epoch_depth = depth
            continue
        for old, new in renames:
            code = f" {code} ".replace(f" {old} ", f" {new} ").strip()
        loop.append((depth - (epoch_depth is not None), code))
    return loop


def lesson_3_loop(source):
    """Lesson 03's ``train_loop`` body, its docstring left out and its NEW lines
    removed, and the renames its docstring lists."""
    lines = function_lines(source, "train_loop")[1:]
    docstring = lines[0][1]
    assert docstring.startswith('"""'), "train_loop has lost its docstring"
    renames = [(tokens_of(old), tokens_of(new))
               for old, new in RENAMED.findall(" ".join(docstring.split()))]
    return without_new_lines(lines[1:]), renames, docstring


def tokens_of(code):
    return logical_lines(code + "\n")[0][1]


def difference(lesson_2_cell, lesson_3_source):
    """The lines that differ (a unified diff), empty when lesson 03's loop without its
    NEW lines is lesson 02's."""
    loop_3, renames, docstring = lesson_3_loop(lesson_3_source)
    assert "one pass" in docstring, ("the docstring no longer says the epochs "
                                     "became one pass")
    loop_2 = lesson_2_loop(lesson_2_cell, renames)
    show = ["    " * depth + code for depth, code in loop_2], [
        "    " * depth + code for depth, code in loop_3]
    return list(difflib.unified_diff(*show, "lesson 02", "lesson 03 without NEW",
                                     lineterm=""))


@pytest.fixture(scope="module")
def sources(read_notebook):
    """(lesson 02's cell defining the loop, lesson 03's loop as the lesson shows it)."""
    cell_2 = next("".join(cell["source"]) for cell in read_notebook(LESSON_2)["cells"]
                  if "def train_with_accelerator(" in "".join(cell["source"]))
    cell_3 = next(cell for cell in read_notebook(LESSON_3)["cells"]
                  if "getsource(train_loop)" in "".join(cell["source"]))
    shown = "".join(cell_3["outputs"][0]["data"]["text/plain"])
    return cell_2, shown


def test_lesson_3_loop_is_lesson_2_loop_plus_the_new_lines(sources):
    diff = difference(*sources)
    assert not diff, "\n".join(diff)


def test_lesson_3_shows_the_helper_it_runs(sources):
    import inspect

    from helpers.local_sgd import train_loop

    # the output's text is the source without its final newline
    assert sources[1] == inspect.getsource(train_loop).rstrip("\n")


def test_the_renames_come_from_the_docstring(sources):
    _, renames, _ = lesson_3_loop(sources[1])
    assert renames == [("dataloader", "batches"),
                       ('CONFIG [ "max_grad_norm" ]', "MAX_GRAD_NORM")]


# Each way the promise can break, applied to the real sources: the test must see it.
BREAKS = {
    "a NEW line left unmarked": (
        3, "local_sgd.step()  # NEW: counts", "local_sgd.step()  # counts"),
    "a line of lesson 2 marked NEW": (
        3, "optimizer.zero_grad()\n", "optimizer.zero_grad()  # NEW\n"),
    "a line of lesson 3 changed": (
        3, "lr_scheduler.step()", "lr_scheduler.step(0)"),
    "a line of lesson 2 changed": (
        2, "optimizer.step()\n", "optimizer.step(); pass\n"),
    "a line of lesson 2 moved out of its block": (
        2, " " * 16 + "optimizer.zero_grad()", " " * 12 + "optimizer.zero_grad()"),
    "a rename the docstring does not state": (
        3, "``dataloader`` (over epochs) is ``batches``",
        "``dataloader`` (over epochs)"),
}


@pytest.mark.parametrize("lesson, old, new", BREAKS.values(), ids=BREAKS.keys())
def test_the_comparison_sees_a_broken_promise(sources, lesson, old, new):
    cell_2, shown = sources
    before = cell_2 if lesson == 2 else shown
    assert before.count(old) == 1, f"no single {old!r} in lesson {lesson}'s loop"
    broken = before.replace(old, new)
    assert difference(*((broken, shown) if lesson == 2 else (cell_2, broken)))
