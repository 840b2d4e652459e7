"""Lesson 05's helpers: the autocast of a named precision, the dtype counter, and the
loss-curve figure.

References: torch.autocast itself (what it enables, what it casts), dtypes checked
against torch.finfo, counts from operations whose dtype under autocast PyTorch's own
tests fix (linear: the low dtype; the losses on the CPU's float32 list), and clear
errors for bad input.
"""
import contextlib
import warnings

import pytest
import torch
from matplotlib.figure import Figure

from helpers import plots
from helpers.mixed_precision import (
    ACCELERATE_NAMES,
    PRECISIONS,
    DtypeCounter,
    autocast_dtype,
    autocast_for,
)


@pytest.mark.parametrize(
    "precision, dtype",
    [("float32", None), ("bfloat16", torch.bfloat16), ("float16", torch.float16),
     (torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16),
     (torch.float32, None)],
)
def test_names_and_dtypes_give_the_autocast_dtype(precision, dtype):
    assert autocast_dtype(precision) == dtype


def test_float32_is_no_autocast_at_all():
    context = autocast_for("float32", "cpu")
    assert isinstance(context, contextlib.nullcontext)
    with context:
        assert not torch.is_autocast_enabled("cpu")


@pytest.mark.parametrize(
    "precision, dtype", [("bfloat16", torch.bfloat16), ("float16", torch.float16)]
)
def test_a_low_precision_runs_a_linear_layer_in_it_as_torch_autocast_does(
    precision, dtype
):
    layer = torch.nn.Linear(8, 4)
    x = torch.randn(2, 8)
    with autocast_for(precision, torch.device("cpu")):  # a device, or its type
        assert (torch.is_autocast_enabled("cpu")
                and torch.get_autocast_dtype("cpu") == dtype)
        ours = layer(x)
    with torch.autocast("cpu", dtype=dtype):
        reference = layer(x)
    assert ours.dtype == dtype and torch.equal(ours, reference)
    assert not torch.is_autocast_enabled("cpu")  # switched off again after the block


@pytest.mark.parametrize("precision, fragments", [
    ("fp32", ["unknown precision 'fp32'", "'float32', 'bfloat16', 'float16'"]),
    ("bf16", ["Accelerate's name", "write 'bfloat16'"]),
    ("fp16", ["Accelerate's name", "write 'float16'"]),
    ("BFLOAT16", ["unknown precision"]),
])
def test_an_unknown_name_gets_a_clear_error(precision, fragments):
    with pytest.raises(ValueError) as raised:
        autocast_dtype(precision)
    for fragment in fragments:
        assert fragment in str(raised.value)


@pytest.mark.parametrize("dtype", [torch.float64, torch.int8, torch.float8_e4m3fn])
def test_a_dtype_autocast_cannot_run_gets_an_error_not_a_warning(dtype):
    with warnings.catch_warnings():
        # torch.autocast would only warn and switch itself off
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="torch.bfloat16 or torch.float16"):
            autocast_for(dtype, "cpu")


def test_torch_autocast_itself_only_warns_for_such_a_dtype():
    # the behaviour autocast_for guards against (torch/amp/autocast_mode.py): a warning,
    # then float32
    with pytest.warns(UserWarning, match="Disabling autocast"):
        context = torch.autocast("cpu", dtype=torch.float64)
    with context:
        assert torch.nn.Linear(4, 4)(torch.randn(1, 4)).dtype == torch.float32


@pytest.mark.parametrize("precision", [None, 16, ["bfloat16"]])
def test_a_precision_that_is_not_a_name_gets_a_type_error(precision):
    with pytest.raises(TypeError, match="precision must be a name"):
        autocast_dtype(precision)


@pytest.mark.parametrize("device_type", ["gpu", "tpu-ish", 3])
def test_an_unknown_device_type_gets_a_clear_error(device_type):
    with pytest.raises(ValueError, match="not available on device type"):
        autocast_for("bfloat16", device_type)


def test_the_accelerate_names_map_to_known_precisions():
    assert set(ACCELERATE_NAMES.values()) == set(PRECISIONS)


def small_forward():
    torch.manual_seed(0)
    layer, norm = torch.nn.Linear(8, 8), torch.nn.LayerNorm(8)
    x = torch.randn(4, 8)
    h = layer(x)  # addmm: bfloat16 under autocast
    h = h.view(2, 16).view(4, 8)  # views: not counted
    residual = x + h  # float32 + bfloat16: float32 by type promotion
    # on the CPU's float32 list
    return torch.nn.functional.mse_loss(norm(residual), torch.zeros(4, 8))


def test_the_counter_sees_what_autocast_ran():
    with torch.autocast("cpu", dtype=torch.bfloat16), DtypeCounter() as counter:
        small_forward()
    assert (counter.counts[("addmm", "bfloat16")] == 1
            and counter.counts[("addmm", "float32")] == 0)
    assert counter.counts[("native_layer_norm", "float32")] == 1
    assert counter.counts[("mse_loss", "float32")] == 1
    assert not any(op == "view" for op, _ in counter.counts)
    assert counter.signatures[("add", ("bfloat16", "float32"), "float32")] == 1
    # the casts autocast inserted: the weight, the bias and the input of the Linear
    # layer
    assert counter.counts[("_to_copy", "bfloat16")] == 3


def test_without_autocast_everything_is_float32():
    with DtypeCounter() as counter:
        small_forward()
    assert counter.counts[("addmm", "float32")] == 1
    assert {dtype for _, dtype in counter.counts} == {"float32"} and not counter.counts[
        ("_to_copy", "float32")
    ]


CURVES = {"float32": [(10, 0.69), (20, 0.6), (30, 0.4)],
          "bfloat16": [(10, 0.7), (20, 0.62), (30, 0.42)]}


def test_the_loss_curves_figure_draws_one_line_per_run():
    fig = plots.loss_curves_figure(CURVES, title="tiny DistilBERT")
    assert isinstance(fig, Figure) and len(fig.axes) == 1
    lines = fig.axes[0].get_lines()
    assert len(lines) == 2 and list(lines[1].get_ydata()) == [0.7, 0.62, 0.42]
    words = {
        t.get_text() for t in fig.findobj(lambda artist: hasattr(artist, "get_text"))
    }
    assert {"float32", "bfloat16", "optimizer step", "training loss",
            "tiny DistilBERT"} <= words


@pytest.mark.parametrize("curves, match", [
    ({}, "curves is empty"),
    ({"a": []}, r"curves\['a'\] is empty"),
    ({"a": [(1, 0.5, 3)]}, r"\(step, loss\) pairs"),
    ({"a": [(1, 0.5), (2, float("nan"))]}, "not finite"),
])
def test_the_loss_curves_figure_explains_bad_input(curves, match):
    with pytest.raises(ValueError, match=match):
        plots.loss_curves_figure(curves)


def test_the_three_levers_figure_highlights_computation():
    fig = plots.three_levers_figure(highlight="computation")
    words = {
        t.get_text() for t in fig.findobj(lambda artist: hasattr(artist, "get_text"))
    }
    assert "Computation\nefficiency" in words and any(
        "mixed precision" in w for w in words
    )


# --- shapes only, and bfloat16 matrix multiplies on float32 kernels
# --------------------------------------------

def test_fake_tensors_give_the_bytes_and_dtypes_of_a_real_run():
    from helpers.memory import measure_memory
    from helpers.mixed_precision import on_fake_tensors

    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)
    )
    x = torch.randn(8, 16)

    def forward():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return net(x).float().sum()

    real = measure_memory(forward)
    net.zero_grad(set_to_none=True)
    with on_fake_tensors():
        fake = measure_memory(forward)
    net.zero_grad(set_to_none=True)
    assert real.saved_bytes > 0
    assert (fake.saved_bytes, fake.peak_activation_bytes) == (
        real.saved_bytes,
        real.peak_activation_bytes,
    )
    with on_fake_tensors(), DtypeCounter() as counter:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            net(x)
    assert counter.counts[("addmm", "bfloat16")] == 2


def test_fast_bfloat16_kernels_is_pytorchs_own_answer_and_refuses_an_unknown_device():
    from helpers.mixed_precision import has_fast_bfloat16_kernels

    assert (
        has_fast_bfloat16_kernels("cpu") == torch.ops.mkldnn._is_mkldnn_bf16_supported()
    )
    with pytest.raises(ValueError, match="'cpu' or 'cuda'"):
        has_fast_bfloat16_kernels("tpu")


def test_the_float32_route_rounds_a_bfloat16_matmul_once_and_leaves_float32_alone():
    from helpers.mixed_precision import BFloat16MatmulsOnFloat32Kernels

    torch.manual_seed(0)
    a, b, bias = torch.randn(32, 64), torch.randn(64, 16), torch.randn(16)
    a16, b16, bias16 = a.bfloat16(), b.bfloat16(), bias.bfloat16()
    with BFloat16MatmulsOnFloat32Kernels() as route:
        product = a16 @ b16
        # beta, alpha: keyword-only
        with_bias = torch.addmm(bias16, a16, b16, beta=0.5, alpha=2.0)
        batched = torch.bmm(a16[None], b16[None])
        batched_with_bias = torch.baddbmm(
            bias16, a16[None], b16[None], beta=0.5, alpha=2.0
        )
        untouched = a @ b  # float32: not the route's business
        # mixed dtypes: PyTorch's own error
        with pytest.raises(RuntimeError, match="same dtype"):
            a @ b16
    assert route.calls == 4
    assert (product.dtype == with_bias.dtype == batched.dtype == batched_with_bias.dtype
            == torch.bfloat16)
    assert torch.equal(product, (a16.float() @ b16.float()).bfloat16())
    expected = torch.addmm(
        bias16.float(), a16.float(), b16.float(), beta=0.5, alpha=2.0
    ).bfloat16()
    assert torch.equal(with_bias, expected)
    assert torch.equal(batched[0], product)
    assert torch.equal(batched_with_bias[0], expected)
    assert torch.equal(untouched, a @ b)


def test_under_autocast_the_route_trains_like_bfloat16s_own_kernel():
    from helpers.mixed_precision import BFloat16MatmulsOnFloat32Kernels

    def step(route):
        torch.manual_seed(0)
        layer = torch.nn.Linear(64, 32)
        x = torch.randn(128, 64)
        with route, torch.autocast("cpu", dtype=torch.bfloat16):
            out = layer(x)
            out.float().pow(2).mean().backward()
        return out, layer.weight.grad

    kernel_out, kernel_grad = step(contextlib.nullcontext())
    route = BFloat16MatmulsOnFloat32Kernels()
    route_out, route_grad = step(route)
    # forward addmm, backward mm for the weight's gradient (x needs none)
    assert route.calls == 2
    assert route_out.dtype == torch.bfloat16
    # the rest: the order of the additions
    assert (kernel_out == route_out).float().mean() > 0.99
    assert ((kernel_grad - route_grad).norm() / kernel_grad.norm()) < 0.01


def test_the_route_gives_pytorchs_kernels_back_after_its_block_even_after_an_error():
    from helpers.mixed_precision import BFloat16MatmulsOnFloat32Kernels

    a, b = torch.randn(8, 8).bfloat16(), torch.randn(8, 8).bfloat16()
    route = BFloat16MatmulsOnFloat32Kernels()
    with pytest.raises(ZeroDivisionError):
        with route:
            a @ b
            raise ZeroDivisionError("an error inside the block")
    # after the block: PyTorch's kernels, not counted
    _ = a @ b, torch.baddbmm(a[None], a[None], b[None])
    assert route.calls == 1
    with route:  # and the same route can be entered again
        a @ b
    assert route.calls == 2


def test_the_route_cannot_be_entered_twice_at_once():
    from helpers.mixed_precision import BFloat16MatmulsOnFloat32Kernels

    route = BFloat16MatmulsOnFloat32Kernels()
    with route:
        with pytest.raises(RuntimeError, match="already in use"):
            with route:
                pass
        torch.randn(4, 4).bfloat16() @ torch.randn(4, 4).bfloat16()  # still routed
    assert route.calls == 1


def test_a_route_that_fails_to_start_leaves_no_kernel_overridden(monkeypatch):
    from helpers.mixed_precision import BFloat16MatmulsOnFloat32Kernels

    real_impl = torch.library.Library.impl

    def impl_failing_at_bmm(library, name, *args, **kwargs):
        if name == "bmm":
            raise RuntimeError("registration failed")
        return real_impl(library, name, *args, **kwargs)

    monkeypatch.setattr(torch.library.Library, "impl", impl_failing_at_bmm)
    route = BFloat16MatmulsOnFloat32Kernels()
    with pytest.raises(RuntimeError, match="registration failed"):
        route.__enter__()
    monkeypatch.undo()
    a = torch.randn(4, 4).bfloat16()
    # mm and addmm were overridden before bmm failed: PyTorch's own again
    a @ a, torch.addmm(a, a, a)
    assert route.calls == 0
    with route:  # and the route is not stuck "in use"
        a @ a
    assert route.calls == 1


def test_autocast_rules_are_measured_per_device_type_and_differ_where_the_source_says():
    from helpers.mixed_precision import AUTOCAST_PROBES, POLICIES, autocast_policy

    cpu, cuda = autocast_policy("cpu"), autocast_policy("cuda")
    assert set(cpu) == set(cuda) == set(AUTOCAST_PROBES)
    assert set(cpu.values()) | set(cuda.values()) <= set(POLICIES)
    # on both lists of aten/src/ATen/autocast_mode.cpp, or on neither
    for rules in (cpu, cuda):
        assert rules["linear, matmul"] == "to bfloat16"
        assert rules["cross-entropy loss"] == "to float32"
        assert rules["GELU"] == rules["embedding"] == "follows its input"
    # on the CUDA float32 list only
    assert {op: (cpu[op], cuda[op])
            for op in ("layer norm", "softmax", "exp, sum")} == {
        op: ("follows its input", "to float32")
        for op in ("layer norm", "softmax", "exp, sum")}


def test_measuring_the_rules_leaves_autocast_as_it_was():
    from helpers.mixed_precision import autocast_policy

    with torch.autocast("cpu", dtype=torch.float16):
        autocast_policy("cpu")
        assert (torch.is_autocast_enabled("cpu")
                and torch.get_autocast_dtype("cpu") == torch.float16)
        assert torch.nn.functional.linear(torch.ones(2, 2),
                                          torch.ones(2, 2)).dtype == torch.float16
    autocast_policy("cuda")
    assert (not torch.is_autocast_enabled("cuda")
            and not torch.is_autocast_enabled("cpu"))


def test_the_rules_of_an_unknown_device_type_get_a_clear_error():
    from helpers.mixed_precision import autocast_policy

    with pytest.raises(ValueError, match="device_type must be 'cpu' or 'cuda'"):
        autocast_policy("tpu")


def test_the_bfloat16_kernel_is_named_from_what_pytorch_reports(monkeypatch):
    import helpers.mixed_precision as mixed_precision

    assert mixed_precision.bfloat16_matmul_kernel("cpu") == (
        "the generic loop" if not mixed_precision.has_fast_bfloat16_kernels("cpu")
        else "AMX" if torch.cpu.get_capabilities().get("amx_bf16")
        else "oneDNN's AVX512-BF16 kernel"
        if torch.cpu.get_capabilities().get("avx512_bf16")
        else "oneDNN's ARM BF16 kernel" if torch.cpu.get_capabilities().get("bf16")
        else "oneDNN's kernel, no bfloat16 multiply instructions")
    monkeypatch.setattr(mixed_precision, "has_fast_bfloat16_kernels",
                        lambda device_type="cpu": False)
    assert mixed_precision.bfloat16_matmul_kernel("cpu") == "the generic loop"
    assert mixed_precision.bfloat16_matmul_kernel("cuda") == "emulated on this GPU"


def test_device_name_names_the_cpu_as_torch_reports_it_without_host_or_user():
    import getpass
    import platform
    import socket

    from helpers.device import device_name

    name = device_name("cpu")
    assert name == (torch.cpu.get_capabilities().get("cpu_name") or platform.machine())
    assert socket.gethostname() not in name and getpass.getuser() not in name
    with pytest.raises(ValueError, match="names a 'cpu' or 'cuda' device"):
        device_name("meta")
