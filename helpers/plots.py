"""The course's figures, one function each (from lesson 01 on). Each takes data and
returns a matplotlib Figure.

No function here saves a file or changes global matplotlib settings. Each one checks its
input first, so that a mistake gets a sentence instead of a traceback from inside
matplotlib.
"""
import math

from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch

from helpers.units import GiB, MiB

HIGHLIGHT, MUTED = "#d95f02", "#bdbdbd"
STATUS_COLOURS = {  # used by the recompute-graph figure
    "input": "#9ecae1",
    "kept": "#1b9e77",
    "recomputed": "#d95f02",
    "not kept": "#ffffff",
}


def _require_some(values, name, what):
    # len, not truth: a tensor or an array of values has no single truth value
    if len(values) == 0:
        raise ValueError(f"{name} is empty: pass at least one {what}")


def _require_rows(rows, name, keys):
    _require_some(rows, name, "row")
    for i, row in enumerate(rows):
        missing = [key for key in keys if key not in row]
        if missing:
            raise ValueError(f"{name}[{i}] lacks {', '.join(map(repr, missing))}; "
                             "every row needs "
                             f"{', '.join(map(repr, keys))}")


def _finite_number(value):
    """Whether ``value`` is a finite real number (a bool is not one)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def _require_positive_int(value, name):
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def three_levers_figure(highlight="memory"):
    """Lesson 01 (and 00, 03, 04, 05, 06): the three levers of efficient training.

    ``highlight`` names the lever a lesson pulls; None shows the three alike (lesson
    00's map).
    """
    levers = {
        "memory": ("Memory\nefficiency", "gradient checkpointing,\noptimizer state, "
                                          "sharding"),
        "communication": ("Communication\nefficiency", "Local SGD"),
        "computation": ("Computation\nefficiency", "mixed precision\n(16-bit "
                                                   "arithmetic)"),
    }
    if highlight is not None and highlight not in levers:
        raise ValueError(f"highlight must be one of {', '.join(levers)} or None, "
                         f"not {highlight!r}")
    fig = Figure(figsize=(9, 2.8))
    ax = fig.add_subplot()
    for i, (name, (title, examples)) in enumerate(levers.items()):
        lit = highlight in (None, name)
        ax.add_patch(
            FancyBboxPatch((i * 3.2, 0), 2.8, 2, boxstyle="round,pad=0.1",
                           facecolor=HIGHLIGHT if lit else MUTED, edgecolor="black",
                           alpha=0.9 if lit else 0.5)
        )
        ax.text(i * 3.2 + 1.4, 1.35, title, ha="center", va="center", fontsize=13,
                weight="bold")
        ax.text(i * 3.2 + 1.4, 0.45, examples, ha="center", va="center", fontsize=10)
    ax.set_xlim(-0.3, 9.5)
    ax.set_ylim(-0.3, 2.3)
    ax.axis("off")
    fig.suptitle("Three levers of efficient training", fontsize=14)
    return fig


LEVER_ROWS = ("memory", "communication", "computation")


def course_map_figure(lessons):
    """Lesson 00: the course map, each lesson a box in the row of the lever it pulls.

    ``lessons`` is a list of dicts with 'number' (e.g. "01"), 'title', 'lever' (one of
    memory, communication, computation, or "all" for a lesson that weighs the three
    together) and 'measures' (a few words: what the lesson measures).
    """
    _require_rows(lessons, "lessons", ("number", "title", "lever", "measures"))
    for lesson in lessons:
        if lesson["lever"] not in (*LEVER_ROWS, "all"):
            raise ValueError(f"lesson {lesson['number']}: lever must be one of "
                             f"{', '.join(LEVER_ROWS)} or 'all', "
                             f"not {lesson['lever']!r}")
    fig = Figure(figsize=(12, 4))
    ax = fig.add_subplot()
    width, gap, row_height, box_height = 2.0, 0.2, 1.25, 1.05
    for row, lever in enumerate(LEVER_ROWS):
        y = (2 - row) * row_height
        ax.text(-0.25, y, f"{lever.capitalize()}\nefficiency", ha="right", va="center",
                fontsize=11, weight="bold")
        ax.axhline(y, color=MUTED, linewidth=0.8, zorder=0)
    for i, lesson in enumerate(lessons):
        x = i * (width + gap)
        spans_all = lesson["lever"] == "all"
        row = 1 if spans_all else 2 - LEVER_ROWS.index(lesson["lever"])
        y = row * row_height
        height = 2 * row_height + box_height if spans_all else box_height
        ax.add_patch(FancyBboxPatch((x, y - height / 2), width, height,
                                    boxstyle="round,pad=0.05", facecolor=HIGHLIGHT,
                                    edgecolor="black", alpha=0.9))
        ax.text(x + width / 2, y + 0.2, f"{lesson['number']}\n{lesson['title']}",
                ha="center", va="center", fontsize=10, weight="bold")
        ax.text(x + width / 2, y - 0.3, lesson["measures"], ha="center", va="center",
                fontsize=8.5)
    ax.set_xlim(-2.0, len(lessons) * (width + gap))
    ax.set_ylim(-0.6, 2 * row_height + 0.6)
    ax.axis("off")
    fig.subplots_adjust(left=0.01, right=0.99, bottom=0.01, top=0.9)
    fig.suptitle("The course map: one lever a lesson, then a plan with all three",
                 fontsize=14)
    return fig


# node -> (x, y) for the A + B = C graph
GRAPH_LAYOUT = {"x": (0, 1), "A": (1.3, 1.8), "B": (1.3, 0.2), "C": (2.6, 1),
                "loss": (3.9, 1)}
GRAPH_EDGES = [("x", "A"), ("x", "B"), ("A", "C"), ("B", "C"), ("C", "loss")]
NEUTRAL_NODE_COLOUR = "#e0e0e0"  # a node before any choice of what to keep


def recompute_graph_figure(statuses_by_mode, labels=None, panel_size=(4.2, 3.2)):
    """Lesson 01: the x -> A, B -> C -> loss graph, one panel per checkpointing mode.

    ``statuses_by_mode`` maps a mode name to {node: status}, status one of
    'input', 'kept' (held for backward), 'recomputed' (ran again in backward), 'not
    kept'. A node without a status is drawn in a neutral grey: ``{}`` draws the bare
    graph, before any choice of what to keep. The legend lists the statuses drawn, and
    is left out when there are none. ``labels`` optionally maps a node to the text drawn
    in it. ``panel_size`` is one panel's (width, height) in inches: a wide, low panel
    sits under a bullet on a slide.
    """
    _require_some(statuses_by_mode, "statuses_by_mode", "mode name mapped to {node: "
                                                        "status}")
    if len(panel_size) != 2 or not all(
        isinstance(v, (int, float)) and v > 0 for v in panel_size
    ):
        raise ValueError("panel_size must be (width, height) in inches, both > 0, "
                         f"got {panel_size!r}")
    labels = labels or {}
    for where, nodes in [("labels", labels), *statuses_by_mode.items()]:
        unknown = set(nodes) - set(GRAPH_LAYOUT)
        if unknown:
            raise ValueError(f"{where}: unknown node {sorted(unknown)}; "
                             f"the graph's nodes are {', '.join(GRAPH_LAYOUT)}")
    for mode, statuses in statuses_by_mode.items():
        unknown = {s for s in statuses.values() if s not in STATUS_COLOURS}
        if unknown:
            raise ValueError(f"{mode}: unknown status {unknown}; use one of "
                             f"{', '.join(STATUS_COLOURS)}")
    width, height = panel_size
    fig = Figure(figsize=(width * len(statuses_by_mode), height))
    axes = fig.subplots(1, len(statuses_by_mode), squeeze=False)[0]
    for ax, (mode, statuses) in zip(axes, statuses_by_mode.items()):
        for start, end in GRAPH_EDGES:
            (x0, y0), (x1, y1) = GRAPH_LAYOUT[start], GRAPH_LAYOUT[end]
            ax.annotate(
                "",
                xy=(x1, y1),
                xytext=(x0, y0),
                arrowprops=dict(arrowstyle="->", shrinkA=17, shrinkB=17, color="black"),
            )
        for node, (x, y) in GRAPH_LAYOUT.items():
            colour = STATUS_COLOURS.get(statuses.get(node), NEUTRAL_NODE_COLOUR)
            ax.scatter([x], [y], s=1300, c=colour, edgecolors="black", zorder=3)
            ax.text(x, y, labels.get(node, node), ha="center", va="center", fontsize=11,
                    zorder=4)
        ax.set_title(mode, fontsize=12)
        ax.set_xlim(-0.5, 4.4)
        ax.set_ylim(-0.4, 2.4)
        ax.axis("off")
    drawn = {s for statuses in statuses_by_mode.values() for s in statuses.values()}
    handles = [
        axes[0].scatter([], [], s=120, c=colour, edgecolors="black", label=status)
        for status, colour in STATUS_COLOURS.items() if status in drawn
    ]
    if handles:  # the bare graph needs no legend
        fig.legend(handles=handles, loc="lower center", ncol=len(handles),
                   frameon=False)
        # the legend's height, whatever the panel's
        fig.subplots_adjust(bottom=0.18 * 3.2 / height)
    return fig


def live_bytes_figure(timelines, gradient_bytes=None):
    """Lesson 01: the bytes alive over one forward + backward, one line per run
    (checkpointing off, on).

    ``timelines`` maps a run's name to the bytes alive after each allocation or free of
    its step, in order (the running sum of a ``MemoryReport``'s events). Runs with more
    events (checkpointing recomputes) are stretched to the same width: the x axis is the
    share of the step's events. ``gradient_bytes``, if given, is drawn as a line: what
    the gradients alone hold at the end.
    """
    _require_some(timelines, "timelines", "run name mapped to its bytes alive "
                                          "after each event")
    for name, live in timelines.items():
        _require_some(live, f"timelines[{name!r}]", "number of bytes")
        if not all(_finite_number(v) and v >= 0 for v in live):
            raise ValueError(f"timelines[{name!r}] must hold byte counts >= "
                             "0, one per event")
    fig = Figure(figsize=(8, 3))
    ax = fig.add_subplot()
    for name, live in timelines.items():
        shares = [(i + 1) / len(live) for i in range(len(live))]
        ax.plot(shares, [v / MiB for v in live], lw=2, label=name)
    if gradient_bytes is not None:
        ax.axhline(gradient_bytes / MiB, color="black", ls="--", lw=1)
        ax.annotate("the gradients alone", (0.02, gradient_bytes / MiB),
                    textcoords="offset points", xytext=(0, 5), fontsize=9)
    ax.set_xlabel("share of the step (forward, then backward)")
    ax.set_ylabel("bytes alive (MiB)")
    highest = max([max(live) for live in timelines.values()] + [gradient_bytes or 0])
    ax.set_xlim(0, 1)
    ax.set_ylim(0, highest / MiB * 1.15)  # room for the label above the gradients' line
    ax.legend(loc="upper left", bbox_to_anchor=(0.0, 0.85), frameon=False)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def accumulation_timeline_figure(micro_batches):
    """Lesson 02: gradient accumulation, micro-batch by micro-batch, and where the
    optimizer steps.

    ``micro_batches``: one dict per micro-batch, in order, with 'gradient_norm' (the
    norm of the gradients summed so far, after its backward) and 'optimizer_step'
    (whether the optimizer stepped after it).
    """
    _require_rows(micro_batches, "micro_batches", ("gradient_norm", "optimizer_step"))
    norms = [row["gradient_norm"] for row in micro_batches]
    if not all(_finite_number(v) and v >= 0 for v in norms):
        raise ValueError("gradient_norm must be a finite number >= 0 in every "
                         f"row, got {norms}")
    fig = Figure(figsize=(8, 2.8))
    ax = fig.add_subplot()
    positions = range(1, len(micro_batches) + 1)
    ax.bar(positions, norms, width=0.6, color=MUTED, edgecolor="black",
           label="gradients summed so far (norm)")
    for position, row in zip(positions, micro_batches):
        ax.text(
            position, 0, "forward\n+ backward", ha="center", va="bottom", fontsize=8
        )
        if row["optimizer_step"]:
            ax.axvline(position + 0.4, color=HIGHLIGHT, lw=3)
            ax.annotate("optimizer step,\nthen zero_grad",
                        (position + 0.4, max(norms) * 1.05), textcoords="offset points",
                        xytext=(-4, 0), ha="right", color=HIGHLIGHT)
    ax.set_xticks(list(positions), [f"micro-batch {p}" for p in positions])
    ax.set_ylabel("gradient norm")
    ax.set_ylim(0, max(norms) * 1.35 or 1)
    ax.legend(loc="upper left", frameon=False)
    fig.tight_layout()
    return fig


def logged_loss_figure(micro_batch_losses, logged=None):
    """Lesson 02: one optimizer step's micro-batch losses, added up against their mean.

    ``micro_batch_losses``: the mean loss of each micro-batch of the step. ``logged``
    optionally maps a label to a loss a trainer logged for that step, drawn as a line to
    compare with.
    """
    _require_some(micro_batch_losses, "micro_batch_losses", "micro-batch loss")
    if not all(_finite_number(v) for v in micro_batch_losses):
        raise ValueError("micro_batch_losses must be finite numbers, got "
                         f"{list(micro_batch_losses)}")
    count = len(micro_batch_losses)
    fig = Figure(figsize=(7, 3.6))
    ax = fig.add_subplot()
    bottom = 0.0
    for i, loss in enumerate(micro_batch_losses):
        ax.bar(0, loss, bottom=bottom, width=0.5, color=MUTED if i % 2 else "#d9d9d9",
               edgecolor="black")
        ax.text(0, bottom + loss / 2, f"micro-batch {i + 1}: {loss:.2f}", ha="center",
                va="center", fontsize=8)
        bottom += loss
    mean = bottom / count
    ax.bar(1, mean, width=0.5, color=HIGHLIGHT, edgecolor="black")
    ax.text(1, mean, f"{mean:.2f}", ha="center", va="bottom")
    ax.text(0, bottom, f"{bottom:.2f}", ha="center", va="bottom")
    for i, (label, value) in enumerate((logged or {}).items()):
        ax.axhline(value, color="black", ls=["--", ":"][i % 2], lw=1)
        ax.annotate(f"{label}: {value:.2f}", (1.55, value), textcoords="offset points",
                    xytext=(0, 3), ha="right", fontsize=9)
    top = max([bottom, *(logged or {}).values()])
    ax.set_ylim(0, top * 1.15)  # room for the labels above the bars and lines
    ax.set_xticks([0, 1], [f"sum of the {count} losses", "their mean"])
    ax.set_xlim(-0.5, 1.6)
    ax.set_ylabel("loss")
    fig.tight_layout()
    return fig


def local_sgd_payoff_figure(rows, compute_seconds, processes=None):
    """Lesson 03: projected communication per step, by link and run, against compute.

    ``rows``: dicts with 'link' (e.g. '10 Gb/s'), 'run' (e.g. 'DDP') and 'ms_per_step',
    the projected milliseconds of communication per optimizer step (> 0: the axis is
    logarithmic). ``compute_seconds``: one step's computation, drawn as a dashed line.
    ``processes``, if given, is named on the axis: the projection is for that many.
    """
    _require_rows(rows, "rows", ("link", "run", "ms_per_step"))
    bad = [row["ms_per_step"] for row in rows
           if not (_finite_number(row["ms_per_step"]) and row["ms_per_step"] > 0)]
    if bad:
        raise ValueError("ms_per_step must be a finite number > 0 in every row (the "
                         f"axis is logarithmic), got {bad}")
    if not (_finite_number(compute_seconds) and compute_seconds > 0):
        raise ValueError("compute_seconds must be a finite number > 0, "
                         f"got {compute_seconds!r}")
    links = list(dict.fromkeys(row["link"] for row in rows))  # in the order given
    runs = list(dict.fromkeys(row["run"] for row in rows))
    height, colours = 0.8 / len(runs), [MUTED, HIGHLIGHT, "#1b9e77", "#7570b3"]
    fig = Figure(figsize=(8, 1.6 + 0.45 * len(rows)))
    ax = fig.add_subplot()
    for j, run in enumerate(runs):
        for i, row in enumerate(r for r in rows if r["run"] == run):
            y = links.index(row["link"]) + (j - (len(runs) - 1) / 2) * height
            ax.barh(y, row["ms_per_step"], height=height * 0.9, edgecolor="black",
                    color=colours[j % len(colours)], label=None if i else run)
            ax.annotate(f"{row['ms_per_step']:.1f} ms", (row["ms_per_step"], y),
                        textcoords="offset points", xytext=(4, 0), va="center",
                        fontsize=9)
    compute_ms = compute_seconds * 1000
    ax.axvline(compute_ms, color="black", ls="--", lw=1.5)
    ax.annotate(f"one step's compute: {compute_ms:g} ms", (compute_ms, -0.5),
                textcoords="offset points", xytext=(4, 2), fontsize=9)
    ax.set_xscale("log")
    ax.set_yticks(range(len(links)), [f"link of\n{link}" for link in links])
    ax.set_ylim(len(links) - 0.5, -0.65)  # the first link on top, room for the label
    values = [row["ms_per_step"] for row in rows] + [compute_ms]
    ax.set_xlim(min(values) / 2, max(values) * 4)  # room for the bars' labels
    on = f" on {processes} processes" if processes else ""
    ax.set_xlabel(f"projected communication per optimizer step{on} (ms, log)")
    ax.legend(loc="lower right", frameon=False)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def memory_time_tradeoff_figure(rows, reference_blocks=None):
    """Lesson 01: peak activation memory against time overhead, one point per strategy.

    ``rows``: list of dicts with 'name', 'peak_activation_mib', 'time_ratio'. With
    ``reference_blocks`` = n, Chen et al. 2016's sqrt(n) memory at about one extra
    forward pass (time x 4/3, a forward being about a third of forward + backward) is
    drawn too.
    """
    _require_rows(rows, "rows", ("name", "peak_activation_mib", "time_ratio"))
    if reference_blocks is not None:
        _require_positive_int(reference_blocks, "reference_blocks (the number of "
                                                "checkpointable blocks)")
    fig = Figure(figsize=(6.5, 4))
    ax = fig.add_subplot()
    for row in rows:
        ax.scatter(row["time_ratio"], row["peak_activation_mib"], s=60, zorder=3)
        ax.annotate(row["name"], (row["time_ratio"], row["peak_activation_mib"]),
                    textcoords="offset points", xytext=(6, 6))
    if reference_blocks:
        baseline = max(r["peak_activation_mib"] for r in rows)
        # sqrt(n) stored inputs + one segment live
        target = baseline * 2 / math.sqrt(reference_blocks)
        ax.scatter([4 / 3], [target], marker="*", s=220, c="black", zorder=3)
        # to the star's left, right-aligned: the measured strategies' labels sit to
        # their right
        ax.annotate("Chen et al. 2016:\nO(sqrt n) memory,\n~1 extra forward",
                    (4 / 3, target), textcoords="offset points", xytext=(-12, 0),
                    ha="right", va="center")
    ax.set_xlabel("time per training step, relative to no checkpointing")
    ax.set_ylabel("peak activation memory (MiB)")
    ax.set_ylim(0, max(r["peak_activation_mib"] for r in rows) * 1.15)
    ax.set_xlim(0.95, max([4 / 3] + [r["time_ratio"] for r in rows]) + 0.15)
    ax.grid(alpha=0.3)
    return fig


def ease_versus_customisability_figure(placements):
    """Lesson 02: the deck's chart of ways to train, by ease of use and customisability.

    ``placements`` maps a way to train to (ease of use, customisability), each "low",
    "medium" or "high": the deck's judgement, which the figure says it is; nothing here
    is measured.
    """
    levels = {"low": 1, "medium": 2, "high": 3}
    _require_some(placements, "placements", "way to train mapped to (ease of use, "
                                            "customisability)")
    for name, placement in placements.items():
        if len(placement) != 2 or not set(placement) <= set(levels):
            raise ValueError(f"placements[{name!r}] must be (ease of use, "
                             "customisability), each "
                             f"one of {', '.join(levels)}; got {placement!r}")
    fig = Figure(figsize=(6.5, 3.2))
    ax = fig.add_subplot()
    for name, (ease, custom) in placements.items():
        ax.scatter([levels[custom]], [levels[ease]], s=160, zorder=3)
        ax.annotate(name, (levels[custom], levels[ease]), textcoords="offset points",
                    xytext=(12, -4))
    ticks = list(levels.values())
    ax.set_xticks(ticks, list(levels))
    ax.set_yticks(ticks, list(levels))
    ax.set_xlim(0.5, 3.9)
    ax.set_ylim(0.5, 3.5)
    ax.set_xlabel("customisability")
    ax.set_ylabel("ease of use")
    ax.set_title(
        "As the slides place them: a judgement, not a measurement", fontsize=10
    )
    ax.grid(alpha=0.3)
    return fig


def sync_timeline_figure(events_by_run, last_step=24):
    """Lesson 03: one timeline per worker and run; a mark where the worker communicated.

    ``events_by_run`` maps a run name to its per-worker event lists, each event
    a dict with "step", "seconds", "collective" and "bytes", as helpers.collectives logs
    it.
    """
    _require_some(events_by_run, "events_by_run", "run name mapped to its "
                                                  "per-worker event lists")
    _require_positive_int(last_step, "last_step")
    for run, events_by_rank in events_by_run.items():
        _require_some(events_by_rank, f"events_by_run[{run!r}]", "worker's event list")
        for rank, events in enumerate(events_by_rank):
            # a worker that never communicated has an empty list, and that is fine
            if events:
                _require_rows(
                    events, f"events_by_run[{run!r}][{rank}]", ("step", "collective")
                )
    fig = Figure(figsize=(9, 1.2 + 1.0 * len(events_by_run)))
    axes = fig.subplots(len(events_by_run), 1, squeeze=False)[:, 0]
    for ax, (run, events_by_rank) in zip(axes, events_by_run.items()):
        for rank, events in enumerate(events_by_rank):
            y = len(events_by_rank) - 1 - rank
            ax.broken_barh(
                [(s - 0.95, 0.9) for s in range(1, last_step + 1)],
                (y - 0.15, 0.3),
                # local computation, one block per step
                facecolors="#c6dbef",
            )
            synced = sorted(
                {e["step"] for e in events
                 if e["collective"] != "barrier" and e["step"] <= last_step}
            )
            ax.scatter(
                synced, [y] * len(synced), marker="|", s=500, c=HIGHLIGHT, zorder=3
            )
        ax.set_yticks(range(len(events_by_rank)),
                      [f"worker {r}" for r in reversed(range(len(events_by_rank)))])
        ax.set_xlim(0, last_step + 0.5)
        ax.set_ylim(-0.6, len(events_by_rank) - 0.4)
        ax.set_title(f"{run}: orange = synchronization (logged collective)",
                     fontsize=10, loc="left")
    axes[-1].set_xlabel("optimizer step")
    fig.tight_layout()
    return fig


def weight_gap_figure(gaps, local_sgd_steps):
    """Lesson 03: largest weight difference between workers after each step, syncs
    marked.

    ``gaps`` is a list of (optimizer step, gap) pairs; every ``local_sgd_steps``-th step
    is marked.
    """
    _require_some(gaps, "gaps", "(step, gap) pair")
    _require_positive_int(local_sgd_steps, "local_sgd_steps")
    fig = Figure(figsize=(7, 3))
    ax = fig.add_subplot()
    steps, values = zip(*gaps)
    ax.plot(steps, values, marker="o", ms=3)
    for step in steps:
        if step % local_sgd_steps == 0:
            ax.axvline(step, color=HIGHLIGHT, alpha=0.5, lw=1)
    ax.set_xlabel("optimizer step (orange: synchronization)")
    ax.set_ylabel("max |weight difference|")
    ax.grid(alpha=0.3)
    return fig


def communication_sweep_figure(rows, ddp_row):
    """Lesson 03: what Local SGD sends per optimizer step against its k, DDP as the
    reference.

    ``rows``: dicts with 'k', 'mib_per_step' (MiB each process sent) and
    'collectives_per_step' (rounds in which every process waits); ``ddp_row`` has the
    same two measures for DDP.
    """
    measures = ("mib_per_step", "collectives_per_step")
    _require_rows(rows, "rows", ("k", *measures))
    _require_rows([ddp_row], "ddp_row", measures)
    fig = Figure(figsize=(10, 3.6))
    ks = [r["k"] for r in rows]
    labels = {"mib_per_step": "MiB sent by process 0, per step",
              "collectives_per_step": "collectives per step"}
    for ax, measure in zip(fig.subplots(1, 2), measures):
        ax.plot(ks, [r[measure] for r in rows], marker="o", label="Local SGD")
        ax.axhline(ddp_row[measure], color=MUTED, ls="--", label="DDP (every step)")
        ax.set_yscale("log")
        ax.set_ylabel(labels[measure])
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.set_xlabel("local_sgd_steps k")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    return fig


def optimizer_tradeoff_figure(rows, state_budget_bytes=GiB):
    """Lesson 04: optimizers placed by two measurements, the deck's two axes.

    ``rows``: dicts with 'name', 'bytes_per_parameter' (measured state bytes) and
    'update_distance': how far the optimizer's update lands from float32 AdamW's after
    the same steps on the same gradients, as a share of AdamW's update (0 for AdamW
    itself). The x axis shows how many parameters fit when the optimizer state may use
    ``state_budget_bytes``: the deck's "number of parameters"; the y axis stands in for
    its "precision", measured (lower is closer to AdamW).
    """
    _require_rows(rows, "rows", ("name", "bytes_per_parameter", "update_distance"))
    not_positive = [row["name"] for row in rows if not row["bytes_per_parameter"] > 0]
    if not_positive:
        raise ValueError("bytes_per_parameter must be > 0 (a measured size), but is "
                         f"not for {not_positive}")
    negative = [row["name"] for row in rows
                if not _finite_number(row["update_distance"])
                or row["update_distance"] < 0]
    if negative:
        raise ValueError("update_distance must be a number >= 0 (a measured share), "
                         f"but is not for {negative}")
    if not state_budget_bytes > 0:
        raise ValueError(f"state_budget_bytes must be > 0, got {state_budget_bytes!r}")
    fig = Figure(figsize=(8, 3.0))
    ax = fig.add_subplot()
    for index, row in enumerate(rows):
        affordable = state_budget_bytes / row["bytes_per_parameter"]
        ax.scatter([affordable], [row["update_distance"]], s=120, zorder=3)
        # the first row (the reference) labelled on its left: a neighbour may sit close
        ax.annotate(f"{row['name']}\n{row['bytes_per_parameter']:.2f} B/param",
                    (affordable, row["update_distance"]), textcoords="offset points",
                    xytext=(-10, 4) if index == 0 else (8, 4),
                    ha="right" if index == 0 else "left")
    ax.set_xscale("log")
    ax.set_xlabel("parameters whose optimizer state fits in "
                  f"{state_budget_bytes / GiB:.0f} GiB (log)")
    ax.set_ylabel("update's distance from\nfloat32 AdamW's (share)")
    top = max(row["update_distance"] for row in rows)
    ax.set_ylim(-0.08 * max(top, 0.1), 1.35 * max(top, 0.1))
    ax.set_xlim(
        left=min(state_budget_bytes / r["bytes_per_parameter"] for r in rows) / 30,
        right=max(state_budget_bytes / r["bytes_per_parameter"] for r in rows) * 30,
    )
    ax.set_title("Measured: state bytes (x) and how far the update moves from "
                 "AdamW's (y)", fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def ema_figure(
    gradients, exp_avg, exp_avg_sq, bias_corrected=False, mean=None, second_moment=None
):
    """Lesson 04: a noisy gradient stream and AdamW's two moving averages of it.

    ``bias_corrected``: the averages were divided by 1 - beta**step, as AdamW's step
    uses them. ``mean`` and ``second_moment``, when given, are drawn as dashed lines:
    what the averages estimate.
    """
    _require_some(gradients, "gradients", "gradient value")
    if not len(gradients) == len(exp_avg) == len(exp_avg_sq):
        raise ValueError("gradients, exp_avg and exp_avg_sq need one value per step "
                         "each, got lengths "
                         f"{len(gradients)}, {len(exp_avg)} and {len(exp_avg_sq)}")
    corrected = ", bias-corrected" if bias_corrected else ""
    fig = Figure(figsize=(8, 3.4))
    ax_first, ax_second = fig.subplots(1, 2)
    steps = range(1, len(gradients) + 1)
    ax_first.plot(steps, gradients, lw=0.8, color=MUTED, label="gradient")
    ax_first.plot(steps, exp_avg, color=HIGHLIGHT, label="EMA of gradients "
                                                         f"(exp_avg{corrected})")
    ax_second.plot(
        steps, [g * g for g in gradients], lw=0.8, color=MUTED, label="squared gradient"
    )
    ax_second.plot(steps, exp_avg_sq, color="#1b9e77", label="EMA of squared "
                                                             "gradients "
                                                             f"(exp_avg_sq{corrected})")
    for ax, value, name in ((ax_first, mean, "mean"),
                            (ax_second, second_moment, "second moment")):
        if value is not None:
            ax.axhline(value, color="black", ls="--", lw=1, label=f"true {name}: "
                                                                  f"{value:g}")
    for ax in (ax_first, ax_second):
        ax.set_xlabel("step")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def memory_grid_figure(states, columns=16):
    """Lesson 04: one square per parameter and state; colour = which state, shade = its
    magnitude.

    ``states`` maps a state name to a 1-D sequence of values, one per parameter (a
    tensor or an array: the bytes per parameter in each title are its dtype's).
    """
    import numpy as np

    colormaps = ["Blues", "Oranges", "Greens", "Purples"]
    _require_some(states, "states", "state name mapped to its values")
    if len(states) > len(colormaps):
        raise ValueError(f"at most {len(colormaps)} states can be told apart by "
                         f"colour, got {len(states)}")
    _require_positive_int(columns, "columns")
    for name, values in states.items():
        if len(values) == 0 or len(values) % columns:
            raise ValueError(f"{name!r} has {len(values)} values; pass a non-zero "
                             f"multiple of columns={columns}")
    fig = Figure(figsize=(8, 1.1 + 0.9 * len(states)))
    axes = fig.subplots(len(states), 1, squeeze=False)[:, 0]
    for ax, (name, values), cmap in zip(axes, states.items(), colormaps):
        if hasattr(values, "element_size"):  # a tensor (any dtype, any device)
            value_bytes, values = (values.element_size(),
                                   values.detach().float().cpu().numpy())
        else:
            values = np.asarray(values)
            # 8 for Python floats, 4 for a float32 array
            value_bytes = values.dtype.itemsize
        grid = np.abs(values.astype(float)).reshape(-1, columns)
        ax.imshow(grid / (grid.max() or 1), cmap=cmap, vmin=-0.3, vmax=1)
        ax.set_xticks(np.arange(-0.5, columns, 1), minor=True)
        ax.set_yticks(np.arange(-0.5, grid.shape[0], 1), minor=True)
        ax.grid(which="minor", color="white", lw=1.5)
        ax.tick_params(which="both", length=0, labelbottom=False, labelleft=False)
        ax.set_title(
            f"{name}: {value_bytes} bytes per parameter", fontsize=10, loc="left"
        )
    fig.tight_layout()
    return fig


def _finished_bars(fig, ax, right, xlabel):
    """Horizontal bars, the first row on top, from 0 to ``right``, legend low right."""
    ax.invert_yaxis()
    ax.set_xlim(0, right)
    ax.set_xlabel(xlabel)
    ax.legend(loc="lower right", fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def training_memory_figure(memories, n_parameters):
    """Lesson 04: training memory per parameter, one stacked bar per optimizer.

    ``memories`` maps an optimizer's name to ``helpers.memory_budget.training_memory``'s
    dict (bytes of 'weights', 'gradients', 'optimizer state', 'activations'); each bar
    shows them divided by ``n_parameters``.
    """
    kinds = ("weights", "gradients", "optimizer state", "activations")
    _require_some(memories, "memories", "optimizer name mapped to training_memory(...)")
    _require_positive_int(n_parameters, "n_parameters")
    for name, memory in memories.items():
        missing = [kind for kind in kinds if kind not in memory]
        if missing:
            raise ValueError(f"memories[{name!r}] lacks "
                             f"{', '.join(map(repr, missing))}: "
                             "pass the dict that "
                             "helpers.memory_budget.training_memory returns")
    fig = Figure(figsize=(8, 3.2))
    ax = fig.add_subplot()
    names = list(memories)
    colours = {"weights": MUTED, "gradients": "#969696", "optimizer state": HIGHLIGHT,
               "activations": "#9ecae1"}
    left = [0.0] * len(names)
    for kind in kinds:
        widths = [memories[name][kind] / n_parameters for name in names]
        ax.barh(names, widths, left=left, color=colours[kind], edgecolor="black",
                label=kind)
        left = [a + b for a, b in zip(left, widths)]
    for position, total in enumerate(left):
        ax.annotate(f"{total:.1f} bytes", (total, position), textcoords="offset points",
                    xytext=(4, 0), va="center")
    return _finished_bars(fig, ax, max(left) * 1.2, "bytes per parameter")


def loss_curves_figure(curves, title=None):
    """Lesson 05: training loss against optimizer step, one line per run (float32
    against bfloat16).

    ``curves`` maps a run's name to a list of (optimizer step, loss) pairs, in the order
    of the steps.
    """
    _require_some(curves, "curves", "run name mapped to its (step, loss) pairs")
    for name, points in curves.items():
        _require_some(points, f"curves[{name!r}]", "(step, loss) pair")
        if any(len(point) != 2 for point in points):
            raise ValueError(f"curves[{name!r}] must hold (step, loss) pairs, got "
                             f"{points[:3]!r}...")
        finite = [loss for _, loss in points if math.isfinite(loss)]
        if len(finite) < len(points):
            raise ValueError(f"curves[{name!r}] holds {len(points) - len(finite)} "
                             "losses that are not finite "
                             "(inf or NaN): the run diverged; plot it after you "
                             "have found out why")
    fig = Figure(figsize=(7.5, 3.6))
    ax = fig.add_subplot()
    styles = ["-", "--", ":", "-."]
    for i, (name, points) in enumerate(curves.items()):
        steps, losses = zip(*points)
        ax.plot(steps, losses, styles[i % len(styles)], lw=2, label=name)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss")
    if title:
        ax.set_title(title, fontsize=11)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig


BIT_COLOURS = {"sign": "#e7298a", "exponent (range)": "#1b9e77",
               "mantissa (precision)": "#7570b3"}
DTYPE_COLOURS = {"float32": "#4477aa", "bfloat16": HIGHLIGHT}


def number_formats_figure(formats, notes=None):
    """Lesson 05: the bits of each floating-point format: 1 sign bit, the exponent bits,
    the mantissa bits.

    ``formats`` maps a format's name to ``(exponent bits, mantissa bits)``, as
    ``torch.finfo`` gives them; ``notes`` (optional) maps a name to a line shown beside
    its bits (its range and precision, say).
    """
    _require_some(formats, "formats",
                  "format name mapped to (exponent bits, mantissa bits)")
    for name, bits in formats.items():
        if (len(bits) != 2 or not all(isinstance(b, int) and not isinstance(b, bool)
                                      and b > 0 for b in bits)):
            raise ValueError(f"formats[{name!r}] must be (exponent bits, mantissa "
                             f"bits), two positive integers, got {bits!r}")
    notes = notes or {}
    fig = Figure(figsize=(10, 0.9 + 0.75 * len(formats)))
    ax = fig.add_subplot()
    widest = max(1 + e + m for e, m in formats.values())
    for row, (name, (exponent, mantissa)) in enumerate(formats.items()):
        y = len(formats) - 1 - row
        kinds = (["sign"] + ["exponent (range)"] * exponent
                 + ["mantissa (precision)"] * mantissa)
        for i, kind in enumerate(kinds):
            ax.add_patch(FancyBboxPatch((i + 0.08, y + 0.12), 0.84, 0.56,
                                        boxstyle="square,pad=0",
                                        facecolor=BIT_COLOURS[kind], edgecolor="white"))
        ax.text(-0.6, y + 0.4, f"{name}\n{len(kinds)} bits", ha="right", va="center",
                fontsize=10)
        ax.text(1 + exponent / 2, y + 0.4, f"{exponent}", ha="center", va="center",
                color="white", fontsize=9, weight="bold")
        ax.text(1 + exponent + mantissa / 2, y + 0.4, f"{mantissa}", ha="center",
                va="center", color="white", fontsize=9, weight="bold")
        if name in notes:
            ax.text(len(kinds) + 0.6, y + 0.4, notes[name], ha="left", va="center",
                    fontsize=9)
    for kind, colour in BIT_COLOURS.items():
        ax.bar(0, 0, color=colour, label=kind)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=3, frameon=False,
              fontsize=9)
    ax.set_xlim(-4.5, widest + 14)
    ax.set_ylim(-0.1, len(formats))
    ax.axis("off")
    fig.tight_layout()
    return fig


def autocast_layer_figure(dtypes, title=None):
    """Lesson 05: one transformer layer's steps, in order, each coloured by the dtype it
    ran in.

    ``dtypes`` maps a step's name ("Q, K, V projections", "layer norm", ...) to the
    dtype name of its output, "float32" or "bfloat16", in the order the steps run.
    """
    _require_some(dtypes, "dtypes", "step name mapped to a dtype name")
    unknown = {name: dtype for name, dtype in dtypes.items()
               if dtype not in DTYPE_COLOURS}
    if unknown:
        raise ValueError(f"dtypes must be one of {', '.join(DTYPE_COLOURS)}; "
                         f"got {unknown!r}")
    fig = Figure(figsize=(10, 2.0 + 0.05 * len(dtypes)))
    ax = fig.add_subplot()
    per_row = math.ceil(len(dtypes) / 2)
    for i, (name, dtype) in enumerate(dtypes.items()):
        row, column = divmod(i, per_row)
        x, y = column * 2.2, 1.3 - row * 1.3
        ax.add_patch(FancyBboxPatch((x, y), 1.9, 0.8, boxstyle="round,pad=0.05",
                                    facecolor=DTYPE_COLOURS[dtype], edgecolor="black",
                                    alpha=0.85))
        ax.text(x + 0.95, y + 0.4, name, ha="center", va="center", fontsize=9,
                color="white", weight="bold", wrap=True)
        if column < per_row - 1 and i < len(dtypes) - 1:
            ax.annotate("", (x + 2.2, y + 0.4), (x + 1.95, y + 0.4),
                        arrowprops=dict(arrowstyle="->"))
    for dtype, colour in DTYPE_COLOURS.items():
        ax.bar(0, 0, color=colour, label=f"ran in {dtype}")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, 0.02), ncol=2, frameon=False,
              fontsize=10)
    ax.set_xlim(-0.2, per_row * 2.2)
    ax.set_ylim(-0.1, 2.3)
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=11)
    fig.tight_layout()
    return fig


def speed_reference_figure(machines, published=None):
    """Lesson 05: bfloat16 time over float32 time, per measurement, on this machine and
    recorded ones.

    ``machines`` maps a machine's label ("this machine", "Intel Xeon, AVX512-BF16,
    2026-12-06") to ``{measurement: ratio}``; a ratio below 1 means bfloat16 was faster.
    The first machine is drawn in the highlight colour. ``published`` (optional) maps a
    label to ratios taken from a published source, not measured: drawn hatched, after
    the machines.
    """
    _require_some(machines, "machines",
                  "machine label mapped to {measurement: ratio}")
    published = published or {}
    for label, ratios in {**machines, **published}.items():
        _require_some(ratios, f"machines[{label!r}]", "measurement mapped to a ratio")
        bad = {k: v for k, v in ratios.items() if not _finite_number(v) or v <= 0}
        if bad:
            raise ValueError(f"machines[{label!r}]: each ratio must be a finite "
                             f"number > 0 (bfloat16 seconds over float32 seconds), "
                             f"got {bad!r}")
    rows = [(label, ratios, False) for label, ratios in machines.items()]
    rows += [(label, ratios, True) for label, ratios in published.items()]
    measurements = list(dict.fromkeys(m for _, ratios, _ in rows for m in ratios))
    fig = Figure(figsize=(9, 1.4 + 0.45 * len(rows) * len(measurements)))
    ax = fig.add_subplot()
    height = 0.8 / len(rows)
    for i, (label, ratios, is_published) in enumerate(rows):
        for j, measurement in enumerate(measurements):
            if measurement not in ratios:
                continue
            y = j + i * height
            ax.barh(y, ratios[measurement], height=height * 0.9, left=0,
                    color="white" if is_published else HIGHLIGHT if i == 0 else MUTED,
                    hatch="//" if is_published else None, edgecolor="black")
            ax.text(ratios[measurement] * 1.08, y,
                    f"{ratios[measurement]:.2f}x  {label}", va="center", fontsize=8)
    ax.axvline(1.0, color="black", lw=1)
    ax.set_xscale("log")
    ax.set_yticks([j + 0.4 - height / 2 for j in range(len(measurements))],
                  measurements)
    ax.invert_yaxis()
    low = min(min(r.values()) for _, r, _ in rows)
    high = max(max(r.values()) for _, r, _ in rows)
    ax.set_xlim(min(low, 1.0) / 2, max(high, 1.0) * 8)
    ax.set_xlabel("bfloat16 time / float32 time (log scale): "
                  "left of the line, bfloat16 is faster")
    fig.tight_layout()
    return fig


SHARDING_KINDS = {"weights": MUTED, "gradients": "#969696",
                  "optimizer state": HIGHLIGHT}


def sharding_memory_figure(rows, n_parameters):
    """Lesson 06: what each stage keeps on one device, in bytes per parameter.

    ``rows`` hold a stage's ``name`` and the bytes one process held between steps of
    each kind ('weights', 'gradients', 'optimizer state'), and optionally its
    ``peak`` during a step (drawn as a hatched extension).
    """
    _require_rows(rows, "rows", ["name", *SHARDING_KINDS])
    _require_positive_int(n_parameters, "n_parameters")
    for i, row in enumerate(rows):
        values = [row[kind] for kind in SHARDING_KINDS] + (
            [row["peak"]] if "peak" in row else [])
        if not all(_finite_number(v) and v >= 0 for v in values):
            raise ValueError(f"rows[{i}] ({row['name']!r}): bytes must be finite "
                             f"numbers >= 0, got {values!r}")
    fig = Figure(figsize=(9, 1.3 + 0.6 * len(rows)))
    ax = fig.add_subplot()
    names = [row["name"] for row in rows]
    left = [0.0] * len(rows)
    for kind, colour in SHARDING_KINDS.items():
        widths = [row[kind] / n_parameters for row in rows]
        ax.barh(names, widths, left=left, color=colour, edgecolor="black", label=kind)
        left = [a + b for a, b in zip(left, widths)]
    ends = list(left)
    for position, (row, rest) in enumerate(zip(rows, left)):
        label = f"{rest:.1f} between steps"
        if "peak" in row:
            peak = row["peak"] / n_parameters
            ax.barh(position, max(peak - rest, 0), left=rest, color="white",
                    edgecolor="black", hatch="//",
                    label="more during the step" if position == 0 else None)
            ends[position] = max(peak, rest)
            label += f", {peak:.1f} at the peak"
        ax.annotate(label, (ends[position], position), textcoords="offset points",
                    xytext=(4, 0), va="center", fontsize=9)
    return _finished_bars(fig, ax, max(ends) * 1.55,
                          "bytes per parameter, on one process")


def sharding_at_scale_figure(rows, device_bytes):
    """Lesson 06: a model's memory per device under each stage, for several device
    counts, against one device's memory.

    ``rows`` hold ``stage``, ``devices`` (how many share the model) and ``bytes`` (per
    device); ``device_bytes`` is one device's memory, drawn as a line.
    """
    _require_rows(rows, "rows", ["stage", "devices", "bytes"])
    if not _finite_number(device_bytes) or device_bytes <= 0:
        raise ValueError(f"device_bytes must be a number > 0 (one device's memory), "
                         f"got {device_bytes!r}")
    for i, row in enumerate(rows):
        if not _finite_number(row["bytes"]) or row["bytes"] < 0:
            raise ValueError(f"rows[{i}]['bytes'] must be a finite number >= 0, "
                             f"got {row['bytes']!r}")
        _require_positive_int(row["devices"], f"rows[{i}]['devices']")
    counts = list(dict.fromkeys(row["devices"] for row in rows))
    stages = list(dict.fromkeys(row["stage"] for row in rows))
    fig = Figure(figsize=(9, 1.1 + 0.3 * len(stages) * len(counts)))
    ax = fig.add_subplot()
    height = 0.8 / len(counts)
    by_key = {(row["stage"], row["devices"]): row["bytes"] for row in rows}
    for j, count in enumerate(counts):
        for i, stage in enumerate(stages):
            if (stage, count) not in by_key:
                continue
            value = by_key[stage, count] / 1e9
            fits = by_key[stage, count] <= device_bytes
            y = i + j * height
            ax.barh(y, value, height=height * 0.9,
                    color=HIGHLIGHT if fits else MUTED, edgecolor="black")
            ax.text(max(value, device_bytes / 1e9) + device_bytes / 1e9 * 0.03, y,
                    f"{value:,.0f} GB on {count} devices"
                    + ("" if fits else ": does not fit"), va="center", fontsize=8)
    ax.axvline(device_bytes / 1e9, color="black", lw=1.5, ls="--",
               label=f"one device: {device_bytes / 1e9:,.0f} GB")
    ax.legend(loc="lower right", fontsize=8, frameon=False)
    ax.set_yticks([i + 0.4 - height / 2 for i in range(len(stages))], stages)
    ax.invert_yaxis()
    most = max(row["bytes"] for row in rows) / 1e9
    ax.set_xlim(0, max(most, device_bytes / 1e9) * 1.45)
    ax.set_xlabel("GB per device (10^9 bytes)")
    fig.tight_layout()
    return fig


# --- lesson 07: plan a training run ------------------------------------------------

PLAN_PART_COLOURS = {  # one colour per part of a plan (helpers.planner.Plan.parts)
    "weights": "#1b9e77", "gradients": "#7570b3", "optimizer state": "#e7298a",
    "activations": "#66a61e", "autocast weight copies": "#e6ab02",
    "transient": "#a6761d", "context": "#bdbdbd"}


LABEL_BOX = dict(boxstyle="square,pad=0.1", facecolor="white", edgecolor="none")


def plan_breakdown_figure(parts, lessons=None, device_bytes=None, title=None,
                          unit=None):
    """Lesson 07: one device's memory in a training step, part by part, each part
    labelled with the lesson that measured it.

    ``parts`` maps a part's name to its bytes (a plan's parts, e.g. weights, gradients,
    optimizer state, activations); ``lessons`` maps a part's name to the lesson that
    measured it (a few words, shown under the part's name); ``device_bytes`` draws one
    device's memory as a dashed line. ``unit``: "GB" (10**9 bytes, as GPUs are sold),
    "GiB" or "MiB"; None picks GiB or MiB by size.
    """
    if not isinstance(parts, dict):
        raise ValueError(f"parts must be a dict of part name -> bytes, got "
                         f"{type(parts).__name__}")
    _require_some(parts, "parts", "part")
    for name, value in parts.items():
        if not _finite_number(value) or value < 0:
            raise ValueError(f"parts[{name!r}] must be a finite number of bytes >= 0, "
                             f"got {value!r}")
    if device_bytes is not None and (not _finite_number(device_bytes)
                                     or device_bytes <= 0):
        raise ValueError(f"device_bytes must be a number > 0 (one device's memory) or "
                         f"None, got {device_bytes!r}")
    units = {"GB": 10**9, "GiB": GiB, "MiB": MiB}
    if unit is not None and unit not in units:
        raise ValueError(f"unit must be one of {', '.join(units)} or None, got "
                         f"{unit!r}")
    lessons = lessons or {}
    total = sum(parts.values())
    if unit is None:
        unit = "GiB" if max(total, device_bytes or 0) >= GiB else "MiB"
    scale = units[unit]
    fig = Figure(figsize=(10, 3.2))
    ax = fig.add_subplot()
    left = 0.0
    shown = [(name, value) for name, value in parts.items() if value > 0]
    right = max(total, device_bytes or 0) / scale
    gap = right * 0.16  # a label's width, about: labels on one side stay this apart
    last_x = {True: -math.inf, False: -math.inf}  # above, below: the last label's x
    for i, (name, value) in enumerate(shown):
        width = value / scale
        ax.barh(0, width, left=left, color=PLAN_PART_COLOURS.get(name, MUTED),
                edgecolor="black", label=name)
        label = f"{name}\n{width:,.1f} {unit}"
        if name in lessons:
            label += f"\n{lessons[name]}"
        # alternate above and below the bar, and push a label right of the last one
        # on its side: narrow parts keep their labels apart
        above = i % 2 == 0
        x = max(left + width / 2, last_x[above] + gap)
        last_x[above] = x
        ax.annotate(label, (x, 0.4 if above else -0.4),
                    xytext=(0, 6 if above else -6), textcoords="offset points",
                    ha="center", va="bottom" if above else "top", fontsize=8,
                    bbox=LABEL_BOX)  # the device's dashed line passes behind it
        if x > left + width / 2 + 1e-9:  # a pushed label points at its part
            ax.plot([left + width / 2, x], [0.3 if above else -0.3,
                                            0.45 if above else -0.45],
                    color="black", lw=0.6)
        left += width
    right = left
    if device_bytes is not None:
        ax.axvline(device_bytes / scale, color="black", lw=1.5, ls="--")
        ax.annotate(f"one device: {device_bytes / scale:,.1f} {unit}",
                    (device_bytes / scale, -0.95), ha="right", va="bottom",
                    fontsize=8, xytext=(-4, 0), textcoords="offset points")
        right = max(right, device_bytes / scale)
    ax.set_xlim(0, right * 1.08 or 1)
    ax.set_ylim(-1.6, 1.6)
    ax.set_yticks([])
    ax.set_xlabel(f"{unit} on one device, at the step's peak")
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
    if title:
        ax.set_title(title, fontsize=11)
    fig.tight_layout()
    return fig


def published_runs_figure(rows, title=None):
    """Lesson 07: each published run's memory as predicted, against what its owners
    measured: the planner beside the formula baselines.

    ``rows`` hold 'run' (its name) and, for each predictor, '<predictor>_error' (a
    signed fraction: -0.1 is 10 % under the measured memory): 'error' (the planner),
    'playbook_error' and 'accelerate_error'; a predictor whose key is missing in every
    row is left out. ``title``: where the runs were published.
    """
    _require_rows(rows, "rows", ("run", "error"))
    predictors = {"error": ("this course's planner", HIGHLIGHT, "o"),
                  "playbook_error": ("Playbook: 16 bytes/param + activations",
                                     "#7570b3", "s"),
                  "accelerate_error": ("accelerate estimate-memory", "#666666", "^")}
    for i, row in enumerate(rows):
        for key in predictors:
            if key in row and not _finite_number(row[key]):
                raise ValueError(f"rows[{i}][{key!r}] must be a finite number (a "
                                 f"signed fraction), got {row[key]!r}")
    fig = Figure(figsize=(10, 0.9 + 0.26 * len(rows)))
    ax = fig.add_subplot()
    names = [row["run"] for row in rows]
    y = list(range(len(rows)))
    for key, (label, colour, marker) in predictors.items():
        if not any(key in row for row in rows):
            continue
        points = [(100 * row[key], i) for i, row in enumerate(rows) if key in row]
        ax.scatter([p[0] for p in points], [p[1] for p in points], color=colour,
                   marker=marker, s=45, zorder=3, label=label, edgecolor="black",
                   linewidth=0.5)
    ax.axvline(0, color="black", lw=1)
    ax.axvspan(-15, 15, color=MUTED, alpha=0.25, lw=0, label="within 15 %")
    ax.set_yticks(y, names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("predicted vs measured peak memory (%): left, under; right, over")
    ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="x", alpha=0.3)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def planner_error_figure(errors):
    """Lesson 07's lab: the planner's peak-memory error on each configuration it was
    checked against, one row per group (a lever, a model family).

    ``errors`` maps a group's name to its configurations' signed errors (fractions).
    """
    if not isinstance(errors, dict):
        raise ValueError(f"errors must be a dict of group -> list of signed errors, "
                         f"got {type(errors).__name__}")
    _require_some(errors, "errors", "group")
    for name, values in errors.items():
        _require_some(values, f"errors[{name!r}]", "error")
        if not all(_finite_number(v) for v in values):
            raise ValueError(f"errors[{name!r}] must hold finite numbers (signed "
                             f"fractions), got {list(values)!r:.80}")
    fig = Figure(figsize=(9, 1.2 + 0.4 * len(errors)))
    ax = fig.add_subplot()
    for i, values in enumerate(errors.values()):
        exact = sum(1 for v in values if abs(v) < 0.005)
        ax.scatter([100 * v for v in values], [i] * len(values), color=HIGHLIGHT,
                   alpha=0.6, edgecolor="black", linewidth=0.5, zorder=3)
        ax.annotate(f"{exact} of {len(values)} within 0.5 %", (1.0, i),
                    xycoords=("axes fraction", "data"), xytext=(6, 0),
                    textcoords="offset points", va="center", fontsize=8)
    ax.axvline(0, color="black", lw=1)
    ax.set_yticks(range(len(errors)), list(errors), fontsize=9)
    ax.invert_yaxis()
    ax.set_xlabel("planner's peak memory vs measured (%): left, under; right, over")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig
