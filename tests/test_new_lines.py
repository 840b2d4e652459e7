"""Lesson 03's promise, tested: its ``train_loop`` is lesson 02's Accelerate loop plus
the lines marked ``# NEW``, as Accelerate's tests/test_examples.py diffs each example of
``examples/by_feature`` against its base script.

Both loops are read from the notebooks: lesson 02's from the cell that defines
``train_with_accelerator``, lesson 03's from the cell that defines ``train_loop`` (the
deck's loop, which the worker processes run from ``helpers/local_sgd.py``: the two are
the same text). Lines are compared as Python tokens (comments and wrapping aside) at
their block depth. Lesson 03's ``# NEW`` lines go, with their continuation lines; a
removed ``with ...:`` takes its block's indentation with it. Of lesson 02's function,
the loop is what runs from ``model.train()`` to the ``return``, its epochs made one
pass; the set-up before it (the Accelerator made, checkpointing switched on,
``prepare``) is the caller's in lesson 03. Both loops clip at the same name,
``MAX_GRAD_NORM`` from ``helpers.training``: nothing is renamed (``RENAMED`` is empty).
"""
import difflib
import io
import tokenize

import pytest

LESSON_2 = "notebooks/02_trainer_and_accelerator.ipynb"
LESSON_3 = "notebooks/03_local_sgd.ipynb"
EPOCH_LOOP = "for epoch in range ( epochs ) :"  # lesson 02's, as tokens
# lesson 02's name -> lesson 03's, as tokens: none since lesson 02 clips at
# MAX_GRAD_NORM itself (issue 42: the deck's code, no CONFIG lookup)
RENAMED = []


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
    """Lesson 03's ``train_loop`` body, its NEW lines removed."""
    return without_new_lines(function_lines(source, "train_loop")[1:])


def difference(lesson_2_cell, lesson_3_source):
    """The lines that differ (a unified diff), empty when lesson 03's loop without its
    NEW lines is lesson 02's."""
    loop_2 = lesson_2_loop(lesson_2_cell, RENAMED)
    loop_3 = lesson_3_loop(lesson_3_source)
    show = ["    " * depth + code for depth, code in loop_2], [
        "    " * depth + code for depth, code in loop_3]
    return list(difflib.unified_diff(*show, "lesson 02", "lesson 03 without NEW",
                                     lineterm=""))


def defined_function(cell_source, name):
    """The text of function ``name`` as a cell defines it, up to the cell's end or its
    next top-level line."""
    lines = cell_source.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"def {name}("))
    end = next((i for i in range(start + 1, len(lines))
                if lines[i] and not lines[i].startswith((" ", ")"))), len(lines))
    return "\n".join(lines[start:end]).rstrip()


@pytest.fixture(scope="module")
def sources(read_notebook):
    """(lesson 02's cell defining the loop, lesson 03's ``train_loop`` as its cell
    defines it)."""
    cell_2 = next("".join(cell["source"]) for cell in read_notebook(LESSON_2)["cells"]
                  if "def train_with_accelerator(" in "".join(cell["source"]))
    cell_3 = next("".join(cell["source"]) for cell in read_notebook(LESSON_3)["cells"]
                  if cell["cell_type"] == "code"
                  and "def train_loop(" in "".join(cell["source"]))
    return cell_2, defined_function(cell_3, "train_loop")


def test_lesson_3_loop_is_lesson_2_loop_plus_the_new_lines(sources):
    diff = difference(*sources)
    assert not diff, "\n".join(diff)


def test_the_processes_run_the_loop_the_lesson_shows(sources):
    # as accelerate's tests/test_examples.py: the lesson's cell and the module that the
    # worker processes import hold the same lines, character for character
    import inspect

    from helpers.local_sgd import train_loop

    assert sources[1] == inspect.getsource(train_loop).rstrip()


def test_the_lesson_shows_the_decks_local_sgd_line(sources):
    tokens = [code for _, code, _ in logical_lines(sources[1] + "\n")]
    assert ("with LocalSGD ( accelerator = accelerator , model = model , "
            "local_sgd_steps = 8 , enabled = True ) as local_sgd :") in tokens
    assert "local_sgd . step ( )" in tokens


def test_the_other_runs_loop_differs_only_in_k_and_enabled():
    # DDP (enabled=False) and the lab's sweep over k run train_loop_every: the same
    # lines, with local_sgd_steps and enabled taken as arguments
    import inspect

    from helpers.local_sgd import train_loop, train_loop_every

    def body(function):
        return [(depth, code) for depth, code, _ in
                logical_lines(inspect.getsource(function))[1:]]

    deck, every = body(train_loop), body(train_loop_every)
    differing = [(a, b) for a, b in zip(deck, every) if a != b]
    assert len(deck) == len(every) and differing == [(
        (1, "with LocalSGD ( accelerator = accelerator , model = model , "
            "local_sgd_steps = 8 , enabled = True ) as local_sgd :"),
        (1, "with LocalSGD ( accelerator = accelerator , model = model , "
            "local_sgd_steps = local_sgd_steps , enabled = enabled ) as local_sgd :"),
    )]


# Each way the promise can break, applied to the real sources: the test must see it.
BREAKS = {
    "a NEW line left unmarked": (
        3, "local_sgd.step()  # NEW", "local_sgd.step()"),
    "a line of lesson 2 marked NEW": (
        3, "optimizer.zero_grad()\n", "optimizer.zero_grad()  # NEW\n"),
    "a line of lesson 3 changed": (
        3, "lr_scheduler.step()", "lr_scheduler.step(0)"),
    "a line of lesson 2 changed": (
        2, "optimizer.step()\n", "optimizer.step(); pass\n"),
    "a line of lesson 2 moved out of its block": (
        2, " " * 16 + "optimizer.zero_grad()", " " * 12 + "optimizer.zero_grad()"),
    "a name of lesson 3 changed": (
        3, "MAX_GRAD_NORM)", "1.0)"),
}


@pytest.mark.parametrize("lesson, old, new", BREAKS.values(), ids=BREAKS.keys())
def test_the_comparison_sees_a_broken_promise(sources, lesson, old, new):
    cell_2, shown = sources
    before = cell_2 if lesson == 2 else shown
    assert before.count(old) == 1, f"no single {old!r} in lesson {lesson}'s loop"
    broken = before.replace(old, new)
    assert difference(*((broken, shown) if lesson == 2 else (cell_2, broken)))


@pytest.mark.parametrize("lesson", [LESSON_2, LESSON_3])
def test_both_loops_clip_at_the_same_constant(read_notebook, lesson):
    # an empty RENAMED holds only while both lessons take MAX_GRAD_NORM from one place
    assert any(line.startswith("from helpers.training import")
               and "MAX_GRAD_NORM" in line
               for cell in read_notebook(lesson)["cells"]
               for line in "".join(cell["source"]).splitlines())


def test_k_8_runs_the_decks_loop_and_the_other_runs_its_twin(monkeypatch):
    import helpers.local_sgd as local_sgd

    called = []
    monkeypatch.setattr(local_sgd, "train_loop", lambda *args: called.append("deck"))
    monkeypatch.setattr(local_sgd, "train_loop_every",
                        lambda *args, **kwargs: called.append(kwargs))
    for k in (8, None, 4):
        local_sgd.run_loop(None, None, None, None, [], k)
    assert called == ["deck", {"local_sgd_steps": 1, "enabled": False},
                      {"local_sgd_steps": 4, "enabled": True}]
