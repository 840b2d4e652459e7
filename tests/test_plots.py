"""Every figure of the course: a Figure with the expected panels and words, and clear
errors on bad input.

The inputs have the shapes the notebooks pass (grep notebooks/ for `plots.`).
"""
import inspect
import io

import matplotlib.pyplot as plt
import pytest
import torch
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure

from helpers import plots


def collective_events(every, steps=24):
    """One worker's log as helpers.collectives writes it: an all_reduce every ``every``
    steps."""
    return [{"step": s, "seconds": 0.01 * s, "collective": "all_reduce", "bytes": 4096}
            for s in range(every, steps + 1, every)]


STATUSES = {
    "no checkpointing": {"x": "input", "A": "kept", "B": "kept", "C": "kept",
                         "loss": "not kept"},
    "checkpointing": {"x": "input", "A": "recomputed", "B": "recomputed",
                      "C": "recomputed", "loss": "not kept"},
    "selective (keep B)": {"x": "input", "A": "recomputed", "B": "kept",
                           "C": "recomputed", "loss": "not kept"},
}
STACK_ROWS = [
    {"name": "no checkpointing", "peak_activation_mib": 40.0, "time_ratio": 1.0},
    {"name": "every block", "peak_activation_mib": 9.5, "time_ratio": 1.31},
]
PLACEMENTS = {"Trainer": ("high", "low"), "Accelerator": ("medium", "high")}
LIVE = {"off": [0, 4 * 2**20, 2**20, 3 * 2**20],
        "on": [0, 2**20, 2 * 2**20, 2**20, 3 * 2**20]}
MEMORIES = {
    name: {"weights": 40, "gradients": 40, "optimizer state": state, "activations": 20,
           "total": 100 + state}
    for name, state in [("AdamW", 80), ("Adafactor", 1)]
}
PAYOFF = [{"link": link, "run": run, "ms_per_step": ms} for link, run, ms in (
    ("10 Gb/s", "DDP", 374.7), ("10 Gb/s", "Local SGD k=8", 56.6),
    ("100 Gb/s", "DDP", 38.1), ("100 Gb/s", "Local SGD k=8", 6.6))]
MICRO_BATCHES = [
    {"gradient_norm": 1.0 * i, "optimizer_step": i == 4} for i in range(1, 5)
]
EVENTS = {"DDP": [collective_events(1), collective_events(1)],
          "Local SGD, k = 8": [collective_events(8), collective_events(8)]}
GAPS = [(step, 0.0 if step % 8 == 0 else 0.002 * (step % 8)) for step in range(1, 25)]
SWEEP = [{"k": k, "mib_per_step": 0.5 / k, "collectives_per_step": 41 / k}
         for k in (1, 2, 4, 8, 16)]
DDP_ROW = {"mib_per_step": 0.5, "collectives_per_step": 2}
OPTIMIZER_ROWS = [
    {"name": "AdamW", "bytes_per_parameter": 8.0, "update_distance": 0.0},
    {"name": "8-bit AdamW", "bytes_per_parameter": 2.03, "update_distance": 0.01},
    {"name": "Adafactor", "bytes_per_parameter": 0.05, "update_distance": 0.45},
]
GRADIENTS = [0.5 + (-1) ** i * 0.3 for i in range(200)]
# float32, as AdamW's
GRID = {"gradient": torch.full((32,), 0.1), "EMA of gradients": torch.full((32,), 0.01),
        "EMA of squared gradients": torch.full((32,), 0.001)}
CURVES = {"float32": [(10, 0.69), (20, 0.5)], "bfloat16": [(10, 0.7), (20, 0.52)]}
FORMAT_BITS = {"float32": (8, 23), "float16": (5, 10), "bfloat16": (8, 7)}
LAYER = {"embeddings": "float32", "Q, K, V": "bfloat16", "layer norm": "float32"}
SPEEDS = {"this machine": {"large matrix multiply": 1.6, "tiny step": 2.7},
          "Xeon, recorded": {"large matrix multiply": 1.9}}

# function name -> (arguments, number of panels, words the figure must show)
SHARDING_ROWS = [  # bytes of 10 parameters, as lesson 06 measures them
    {"name": "DDP", "weights": 40, "gradients": 40, "optimizer state": 80, "peak": 200},
    {"name": "ZeRO-3", "weights": 20, "gradients": 20, "optimizer state": 40},
]
AT_SCALE = [{"stage": stage, "devices": 8, "bytes": per_parameter * 7e9}
            for stage, per_parameter in (("DDP", 16), ("ZeRO-3", 2))]

PLAN_PARTS = {"weights": 2 * 2**30, "gradients": 2 * 2**30,  # lesson 07: bytes
              "optimizer state": 4 * 2**30, "activations": 3 * 2**30}
PUBLISHED = [{"run": "baseline", "error": -0.1, "playbook_error": -0.09,
              "accelerate_error": -0.57},
             {"run": "Adafactor", "error": -0.12, "playbook_error": 0.1}]

COURSE_MAP = [
    {"number": "01", "title": "Checkpointing", "lever": "memory",
     "measures": "bytes"},
    {"number": "03", "title": "Local SGD", "lever": "communication",
     "measures": "sent"},
]

GOOD = {
    "three_levers_figure": (dict(highlight="communication"), 1,
                            ["Three levers of efficient training"]),
    "course_map_figure": (dict(lessons=COURSE_MAP), 1,
                          ["01\nCheckpointing", "03\nLocal SGD",
                           "Communication\nefficiency",
                           "The course map: one lever a lesson, "
                           "then a plan with all three"]),
    "recompute_graph_figure": (dict(statuses_by_mode=STATUSES, labels={"A": "A\nsin"}),
                               3, [*STATUSES, "A\nsin", "recomputed"]),
    "memory_time_tradeoff_figure": (
        dict(rows=STACK_ROWS, reference_blocks=16),
        1,
        ["every block", "Chen et al. 2016", "peak activation memory (MiB)"],
    ),
    "ease_versus_customisability_figure": (
        dict(placements=PLACEMENTS),
        1,
        ["Trainer", "customisability", "not a measurement"],
    ),
    "live_bytes_figure": (dict(timelines=LIVE, gradient_bytes=2**20), 1,
                          ["off", "on", "the gradients alone", "bytes alive (MiB)"]),
    "accumulation_timeline_figure": (
        dict(micro_batches=MICRO_BATCHES),
        1,
        ["micro-batch 4", "optimizer step", "gradients summed"],
    ),
    "training_memory_figure": (
        dict(memories=MEMORIES, n_parameters=10),
        1,
        ["AdamW", "optimizer state", "bytes per parameter", "18.0 bytes"],
    ),
    "local_sgd_payoff_figure": (
        dict(rows=PAYOFF, compute_seconds=0.02, processes=8),
        1,
        ["link of\n10 Gb/s", "Local SGD k=8", "374.7 ms", "one step's compute: 20 ms",
         "on 8 processes"],
    ),
    "logged_loss_figure": (
        dict(
            micro_batch_losses=[0.7, 0.69, 0.68, 0.71], logged={"Trainer logged": 2.78}
        ),
        1,
        ["sum of the 4 losses", "their mean", "2.78", "0.69"],
    ),
    "sync_timeline_figure": (
        dict(events_by_run=EVENTS),
        2,
        ["DDP: orange", "Local SGD, k = 8: orange", "optimizer step"],
    ),
    "weight_gap_figure": (dict(gaps=GAPS, local_sgd_steps=8), 1,
                          ["max |weight difference|"]),
    "communication_sweep_figure": (
        dict(rows=SWEEP, ddp_row=DDP_ROW),
        2,
        ["MiB sent by process 0, per step", "collectives per step",
         "local_sgd_steps k"],
    ),
    "optimizer_tradeoff_figure": (
        dict(rows=OPTIMIZER_ROWS),
        1,
        ["8-bit AdamW\n2.03 B/param", "fits in 1 GiB", "float32 AdamW's",
         "Measured"],
    ),
    "ema_figure": (
        dict(gradients=GRADIENTS, exp_avg=GRADIENTS, exp_avg_sq=GRADIENTS,
             bias_corrected=True, mean=0.5, second_moment=1.25),
        2,
        ["step", "exp_avg, bias-corrected", "true second moment: 1.25"],
    ),
    "memory_grid_figure": (dict(states=GRID), 3, ["gradient: 4 bytes per parameter"]),
    "number_formats_figure": (
        dict(formats=FORMAT_BITS, notes={"float16": "largest 65504"}),
        1,
        ["float16\n16 bits", "23", "exponent (range)", "mantissa (precision)",
         "largest 65504"],
    ),
    "autocast_layer_figure": (dict(dtypes=LAYER, title="on CPU"), 1,
                              ["Q, K, V", "ran in bfloat16", "ran in float32",
                               "on CPU"]),
    "speed_reference_figure": (
        dict(machines=SPEEDS),
        1,
        ["large matrix multiply", "tiny step", "1.60x  this machine",
         "1.90x  Xeon, recorded", "left of the line, bfloat16 is faster"],
    ),
    "sharding_memory_figure": (
        dict(rows=SHARDING_ROWS, n_parameters=10),
        1,
        ["DDP", "ZeRO-3", "optimizer state", "more during the step",
         "16.0 between steps, 20.0 at the peak", "bytes per parameter, on one process"],
    ),
    "sharding_at_scale_figure": (
        dict(rows=AT_SCALE, device_bytes=80e9),
        1,
        ["DDP", "112 GB on 8 devices: does not fit", "14 GB on 8 devices",
         "one device: 80 GB"],
    ),
    "plan_breakdown_figure": (
        dict(parts=PLAN_PARTS, lessons={"activations": "lessons 1, 2"},
             device_bytes=80e9, title="a plan"),
        1,
        ["weights\n2.0 GiB", "activations\n3.0 GiB\nlessons 1, 2",
         "one device: 74.5 GiB", "GiB on one device, at the step's peak", "a plan"],
    ),
    "published_runs_figure": (
        dict(rows=PUBLISHED, title="Transformers' docs"),
        1,
        ["baseline", "Adafactor", "this course's planner",
         "accelerate estimate-memory", "within 15 %", "Transformers' docs"],
    ),
    "planner_error_figure": (
        dict(errors={"float32": [0.0, 0.001], "bfloat16": [-0.2, 0.0]}),
        1,
        ["float32", "2 of 2 within 0.5 %", "1 of 2 within 0.5 %"],
    ),
    "loss_curves_figure": (
        dict(curves=CURVES, title="tiny DistilBERT"),
        1,
        ["float32", "bfloat16", "optimizer step", "training loss", "tiny DistilBERT"],
    ),
}


def figure_words(fig):
    """Every piece of text on the figure: titles, axis labels, annotations, legends."""
    return {
        t.get_text() for t in fig.findobj(lambda artist: hasattr(artist, "get_text"))
    }


def test_every_figure_function_has_a_case():
    public = {name for name, f in inspect.getmembers(plots, inspect.isfunction)
              if not name.startswith("_") and f.__module__ == plots.__name__}
    assert public == set(GOOD)


@pytest.mark.parametrize("name", GOOD)
def test_a_figure_with_its_panels_and_words(name):
    arguments, panels, words = GOOD[name]
    fig = getattr(plots, name)(**arguments)
    assert isinstance(fig, Figure)
    assert not plt.get_fignums(), ("made through pyplot: a notebook would show it "
                                   "twice and never free it")
    assert len([ax for ax in fig.axes if ax.get_label() != "<colorbar>"]) == panels
    shown = figure_words(fig)
    for word in words:
        assert any(word in text for text in shown), (f"{word!r} not on the figure; it "
                                                     f"shows {sorted(shown)}")
    # it renders (Agg, without touching pyplot's backend)
    fig.savefig(io.BytesIO(), format="png")


def test_the_bare_recompute_graph_is_neutral_and_has_no_legend():
    bare = plots.recompute_graph_figure({"the example": {}})
    colours = {tuple(c.get_facecolor()[0]) for c in bare.axes[0].collections}
    assert colours == {to_rgba(plots.NEUTRAL_NODE_COLOUR)}  # no status, no colour
    assert not bare.legends
    # with statuses, the legend lists only those drawn
    fig = plots.recompute_graph_figure({"m": {"x": "input", "A": "kept"}})
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["input", "kept"]


def test_a_published_ratio_is_drawn_hatched_after_the_measured_machines():
    fig = plots.speed_reference_figure(SPEEDS, published={
        "A100, datasheet (published)": {"large matrix multiply": 0.0625}})
    ax = fig.axes[0]
    hatched = [bar for bar in ax.patches if bar.get_hatch()]
    assert len(hatched) == 1 and hatched[0].get_width() == 0.0625
    assert any("0.06x  A100, datasheet (published)" in t for t in figure_words(fig))
    assert len(ax.patches) == sum(len(r) for r in SPEEDS.values()) + 1


def test_the_weight_gap_figure_marks_every_synchronization():
    ax = plots.weight_gap_figure(GAPS, local_sgd_steps=8).axes[0]
    # lines[0] is the gap curve
    marked = sorted(line.get_xdata()[0] for line in ax.lines[1:])
    assert marked == [8, 16, 24]


def test_the_sync_timeline_marks_the_steps_that_communicated():
    fig = plots.sync_timeline_figure(EVENTS)
    # Local SGD's worker 1 (the last drawn)
    marks = fig.axes[1].collections[-1].get_offsets()[:, 0]
    assert sorted(marks) == [8, 16, 24]


def test_the_tradeoff_places_each_optimizer_at_its_measured_distance():
    ax = plots.optimizer_tradeoff_figure(OPTIMIZER_ROWS).axes[0]
    placed = [tuple(c.get_offsets()[0]) for c in ax.collections]
    assert placed == [(2**30 / row["bytes_per_parameter"], row["update_distance"])
                      for row in OPTIMIZER_ROWS]
    low, high = ax.get_ylim()
    assert low < 0 < 0.45 < high  # AdamW's 0 and the largest distance both shown


def test_the_memory_grid_reads_the_bytes_from_the_dtype():
    fig = plots.memory_grid_figure(
        {"bfloat16 state": torch.ones(16, dtype=torch.bfloat16)}
    )
    assert "bfloat16 state: 2 bytes per parameter" in figure_words(fig)


BAD = [
    ("number_formats_figure", dict(formats={}), "formats is empty"),
    ("number_formats_figure", dict(formats={"float8": (4, 3.5)}),
     r"formats\['float8'\] must be \(exponent bits, mantissa bits\)"),
    ("autocast_layer_figure", dict(dtypes={}), "dtypes is empty"),
    ("autocast_layer_figure", dict(dtypes={"GELU": "torch.bfloat16"}),
     "must be one of float32, bfloat16"),
    ("speed_reference_figure", dict(machines={}), "machines is empty"),
    ("speed_reference_figure", dict(machines={"mine": {"step": 0}}),
     r"machines\['mine'\]: each ratio must be"),
    ("speed_reference_figure", dict(machines={"mine": {"step": 1.0}},
                                    published={"sheet": {"step": -1}}),
     r"machines\['sheet'\]: each ratio must be"),
    ("three_levers_figure", dict(highlight="speed"),
     "highlight must be one of memory, communication, computation or None"),
    ("course_map_figure", dict(lessons=[]), "lessons is empty"),
    ("course_map_figure", dict(lessons=[{**COURSE_MAP[0], "lever": "speed"}]),
     "lesson 01: lever must be one of memory, communication, computation or 'all'"),
    ("loss_curves_figure", dict(curves={}), "curves is empty"),
    ("loss_curves_figure", dict(curves={"bf16": [(1, 0.5, 0.1)]}), r"curves\['bf16'\] "
     r"must hold " r"\(step, loss\) " r"pairs"),
    ("loss_curves_figure", dict(curves={"fp16": [(1, float("nan"))]}),
     "not finite .* the run diverged"),
    ("recompute_graph_figure", dict(statuses_by_mode={}), "statuses_by_mode is empty"),
    ("recompute_graph_figure", dict(statuses_by_mode={"m": {"D": "kept"}}), r"unknown "
     r"node \['D'\].*x, A, B, C, loss"),
    ("recompute_graph_figure", dict(statuses_by_mode={"m": {"A": "saved"}}),
     "unknown status.*use one of input"),
    ("memory_time_tradeoff_figure", dict(rows=[]), "rows is empty"),
    ("memory_time_tradeoff_figure",
     dict(rows=[{"name": "a", "peak_activation_mib": 1.0}]),
     r"rows\[0\] lacks 'time_ratio'"),
    ("memory_time_tradeoff_figure", dict(rows=STACK_ROWS, reference_blocks=0),
     "reference_blocks .* positive integer"),
    ("ease_versus_customisability_figure", dict(placements={}), "placements is empty"),
    ("ease_versus_customisability_figure",
     dict(placements={"Trainer": ("easy", "low")}),
     r"placements\['Trainer'\] must be .* one of low, medium, high"),
    ("recompute_graph_figure", dict(statuses_by_mode=STATUSES, panel_size=(4, 0)),
     "panel_size must be"),
    ("live_bytes_figure", dict(timelines={}), "timelines is empty"),
    ("live_bytes_figure", dict(timelines={"off": [1, -2]}), r"timelines\['off'\] must "
     r"hold byte counts"),
    ("accumulation_timeline_figure", dict(micro_batches=[{"gradient_norm": 1.0}]),
     r"micro_batches\[0\] lacks 'optimizer_step'"),
    ("accumulation_timeline_figure",
     dict(micro_batches=[{"gradient_norm": float("nan"), "optimizer_step": True}]),
     "finite number"),
    ("logged_loss_figure", dict(micro_batch_losses=[]), "micro_batch_losses is empty"),
    ("local_sgd_payoff_figure", dict(rows=[], compute_seconds=0.02), "rows is empty"),
    ("local_sgd_payoff_figure",
     dict(rows=[{"link": "10 Gb/s", "run": "DDP"}], compute_seconds=0.02),
     r"rows\[0\] lacks 'ms_per_step'"),
    ("local_sgd_payoff_figure",
     dict(rows=[{**PAYOFF[0], "ms_per_step": 0}], compute_seconds=0.02),
     r"ms_per_step must be a finite number > 0 .*got \[0\]"),
    ("local_sgd_payoff_figure", dict(rows=PAYOFF, compute_seconds=0),
     "compute_seconds must be a finite number > 0"),
    ("training_memory_figure", dict(memories={"AdamW": {"weights": 4}}, n_parameters=1),
     r"memories\['AdamW'\] lacks 'gradients'"),
    ("training_memory_figure", dict(memories=MEMORIES, n_parameters=0),
     "n_parameters must be"),
    ("logged_loss_figure", dict(micro_batch_losses=[0.7, float("inf")]),
     "must be finite numbers"),
    ("sync_timeline_figure", dict(events_by_run={}), "events_by_run is empty"),
    ("sync_timeline_figure", dict(events_by_run=EVENTS, last_step=0),
     "last_step must be a positive integer"),
    ("sync_timeline_figure",
     dict(events_by_run={"DDP": [[{"collective": "all_reduce"}]]}),
     r"events_by_run\['DDP'\]\[0\]\[0\] lacks 'step'"),
    ("weight_gap_figure", dict(gaps=[], local_sgd_steps=8), "gaps is empty"),
    ("weight_gap_figure", dict(gaps=GAPS, local_sgd_steps=0),
     "local_sgd_steps must be a positive integer, got 0"),
    ("communication_sweep_figure", dict(rows=[], ddp_row=DDP_ROW), "rows is empty"),
    ("communication_sweep_figure", dict(rows=SWEEP, ddp_row={"mib_per_step": 1}),
     "ddp_row.* lacks 'collectives_per_step'"),
    ("optimizer_tradeoff_figure",
     dict(rows=[{**OPTIMIZER_ROWS[0], "bytes_per_parameter": 0}]),
     r"bytes_per_parameter must be > 0 .*\['AdamW'\]"),
    ("optimizer_tradeoff_figure", dict(rows=OPTIMIZER_ROWS, state_budget_bytes=0),
     "state_budget_bytes must be > 0"),
    ("optimizer_tradeoff_figure",
     dict(rows=[{**OPTIMIZER_ROWS[0], "update_distance": -0.1}]),
     r"update_distance must be a number >= 0 .*\['AdamW'\]"),
    ("ema_figure",
     dict(gradients=GRADIENTS, exp_avg=GRADIENTS[:-1], exp_avg_sq=GRADIENTS),
     "one value per step each, got lengths 200, 199 and 200"),
    ("memory_grid_figure", dict(states={f"state {i}": [1.0] * 16 for i in range(5)}),
     "at most 4 states"),
    ("memory_grid_figure", dict(states={"gradient": [1.0] * 30}),
     "'gradient' has 30 values; .* multiple of columns=16"),
    ("sharding_memory_figure", dict(rows=[{"name": "DDP", "weights": 4}],
                                    n_parameters=1), r"rows\[0\] lacks 'gradients'"),
    ("sharding_memory_figure", dict(rows=[{**SHARDING_ROWS[0], "peak": float("nan")}],
                                    n_parameters=10), "bytes must be finite numbers"),
    ("sharding_memory_figure", dict(rows=SHARDING_ROWS, n_parameters=0),
     "n_parameters must be a positive integer"),
    ("plan_breakdown_figure", dict(parts={}), "parts is empty"),
    ("plan_breakdown_figure", dict(parts={"weights": -1}),
     r"parts\['weights'\] must be a finite number of bytes >= 0"),
    ("plan_breakdown_figure", dict(parts=PLAN_PARTS, device_bytes=0),
     "device_bytes must be a number > 0"),
    ("plan_breakdown_figure", dict(parts=PLAN_PARTS, unit="GB/s"),
     "unit must be one of GB, GiB, MiB"),
    ("published_runs_figure", dict(rows=[{"run": "baseline"}]),
     r"rows\[0\] lacks 'error'"),
    ("published_runs_figure", dict(rows=[{**PUBLISHED[0], "error": None}]),
     r"rows\[0\]\['error'\] must be a finite number"),
    ("planner_error_figure", dict(errors={}), "errors is empty"),
    ("planner_error_figure", dict(errors={"float32": [float("nan")]}),
     r"errors\['float32'\] must hold finite numbers"),
    ("sharding_at_scale_figure", dict(rows=AT_SCALE, device_bytes=0),
     "device_bytes must be a number > 0"),
    ("sharding_at_scale_figure", dict(rows=[{**AT_SCALE[0], "devices": 0}],
                                      device_bytes=80e9),
     r"rows\[0\]\['devices'\] must be a positive integer"),
]


@pytest.mark.parametrize("name, arguments, message", BAD,
                         ids=[f"{name}-{i}" for i, (name, _, _) in enumerate(BAD)])
def test_bad_input_gets_a_sentence(name, arguments, message):
    with pytest.raises(ValueError, match=message):
        getattr(plots, name)(**arguments)


def test_every_figure_function_rejects_some_bad_input():
    assert {name for name, _, _ in BAD} == set(GOOD)


def test_the_payoff_figure_draws_the_compute_line_and_one_bar_per_row():
    ax = plots.local_sgd_payoff_figure(PAYOFF, compute_seconds=0.02).axes[0]
    assert [line.get_xdata()[0] for line in ax.lines] == [20.0]  # ms
    assert sorted(bar.get_width() for bar in ax.patches) == sorted(
        r["ms_per_step"] for r in PAYOFF
    )
def test_the_number_formats_figure_draws_one_cell_per_bit():
    ax = plots.number_formats_figure({"bfloat16": (8, 7)}).axes[0]
    # the bits, and the legend's three colours (empty bars)
    assert len(ax.patches) == 16 + 3


def test_the_speed_figure_draws_each_ratio_and_the_line_at_one():
    ax = plots.speed_reference_figure(SPEEDS).axes[0]
    assert sorted(round(bar.get_width(), 2) for bar in ax.patches) == [1.6, 1.9, 2.7]
    assert [line.get_xdata()[0] for line in ax.lines] == [1.0]


def test_the_sharding_figure_stacks_the_kinds_and_hatches_only_the_peak():
    ax = plots.sharding_memory_figure(SHARDING_ROWS, n_parameters=10).axes[0]
    bars = [p for p in ax.patches if p.get_height() > 0]
    ends = sorted(round(b.get_x() + b.get_width(), 6) for b in bars
                  if not b.get_hatch())
    assert ends == [2.0, 4.0, 4.0, 8.0, 8.0, 16.0]  # weights, gradients, state: stacked
    assert [b.get_width() for b in bars if b.get_hatch()] == [4.0]  # DDP: 20 - 16


def test_the_scale_figure_marks_what_does_not_fit():
    fig = plots.sharding_at_scale_figure(AT_SCALE, device_bytes=80e9)
    colours = [p.get_facecolor() for p in fig.axes[0].patches]
    assert colours[0] != colours[1]  # DDP does not fit, ZeRO-3 does


def test_the_plan_figure_stacks_each_part_in_order():
    ax = plots.plan_breakdown_figure(PLAN_PARTS).axes[0]
    ends = [round(bar.get_x() + bar.get_width(), 6) for bar in ax.patches]
    assert ends == [2.0, 4.0, 8.0, 11.0]  # GiB: weights, gradients, state, activations


def test_the_plan_figure_draws_in_the_unit_asked():
    ax = plots.plan_breakdown_figure(PLAN_PARTS, device_bytes=80e9, unit="GB").axes[0]
    assert round(ax.patches[0].get_width(), 6) == round(PLAN_PARTS["weights"] / 1e9, 6)
    words = [text.get_text() for text in ax.texts]
    assert "one device: 80.0 GB" in words
    assert ax.get_xlabel() == "GB on one device, at the step's peak"


def test_the_published_figure_places_each_error_in_percent():
    ax = plots.published_runs_figure(PUBLISHED).axes[0]
    planner = ax.collections[0].get_offsets()
    assert [round(float(x), 6) for x in planner[:, 0]] == [-10.0, -12.0]
    assert len(ax.collections[2].get_offsets()) == 1  # accelerate: one row has it
