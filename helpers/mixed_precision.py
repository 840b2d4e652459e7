"""Mixed precision made visible (introduced in lesson 05): the autocast of a named
precision, the dtype each operation ran in, shapes-only runs, and bfloat16 matrix
multiplies on a CPU without a bfloat16 kernel.

``autocast_for("bfloat16", "cpu")`` is the context a forward pass runs in for that
precision: nothing at all for "float32", ``torch.autocast`` for "bfloat16" and
"float16". Unlike ``torch.autocast`` itself, which on a CPU only warns and switches
itself off when asked for a dtype it cannot run (torch/amp/autocast_mode.py), it refuses
bad input with a sentence saying what to pass instead. ``DtypeCounter``, a dispatch
mode, counts for each ATen operation that computed something (views, in-place and out=
operations left out) the dtype of its output: what autocast really did, op by op. The
lesson and the practice checks of lesson 05 use both.

``on_fake_tensors()`` runs PyTorch's fake tensors: every operation's shape and dtype
logic, no arithmetic, so that bytes and dtypes are measured quickly even where bfloat16
arithmetic is slow. ``has_fast_bfloat16_kernels`` says whether bfloat16 matrix
multiplies have a fast kernel here, and ``BFloat16MatmulsOnFloat32Kernels`` computes
them with the float32 kernel where they have none (lesson 05's training runs).
"""
import contextlib
import warnings
from collections import Counter

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

# The lesson's names, and the dtype autocast runs the eligible operations in (None: no
# autocast at all).
PRECISIONS = {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}
# The names Accelerate (mixed_precision=...) and Trainer (bf16=True, fp16=True) use for
# the same choices.
ACCELERATE_NAMES = {"no": "float32", "bf16": "bfloat16", "fp16": "float16"}
# what torch.autocast can run in, on the CPU as on a GPU
AUTOCAST_DTYPES = (torch.bfloat16, torch.float16)


def autocast_dtype(precision):
    """The dtype autocast runs in for ``precision`` ('float32', 'bfloat16', 'float16' or
    a dtype); None: float32."""
    if isinstance(precision, torch.dtype):
        if precision == torch.float32:
            return None
        if precision not in AUTOCAST_DTYPES:
            raise ValueError(
                "autocast runs operations in torch.bfloat16 or torch.float16, not in "
                f"{precision}; on a CPU, "
                "torch.autocast would only warn and switch itself off, and everything "
                "would run in float32. Pass "
                "'bfloat16', 'float16', or 'float32' for no autocast.")
        return precision
    if not isinstance(precision, str):
        raise TypeError("precision must be a name such as 'bfloat16' (or a torch "
                        f"dtype), got {precision!r}")
    if precision in PRECISIONS:
        return PRECISIONS[precision]
    known = ", ".join(repr(name) for name in PRECISIONS)
    if precision in ACCELERATE_NAMES:
        raise ValueError(f"{precision!r} is Accelerate's name "
                         f"(Accelerator(mixed_precision={precision!r})); here "
                         f"write {ACCELERATE_NAMES[precision]!r}. Known "
                         f"precisions: {known}.")
    raise ValueError(f"unknown precision {precision!r}; known precisions: {known}.")


def autocast_for(precision, device_type="cpu"):
    """The context a forward pass runs in for ``precision``: no autocast for float32,
    else ``torch.autocast``."""
    dtype = autocast_dtype(precision)
    # a torch.device: its type, as torch.autocast wants it
    if not isinstance(device_type, str):
        device_type = getattr(device_type, "type", device_type)
    try:
        available = isinstance(device_type, str) and torch.amp.is_autocast_available(
            device_type
        )
    except RuntimeError:  # not a device type PyTorch knows at all
        available = False
    if not available:
        raise ValueError(f"autocast is not available on device type {device_type!r}; "
                         "pass 'cpu', or 'cuda' on a GPU "
                         "(the device's .type).")
    if dtype is None:
        return contextlib.nullcontext()
    if (device_type == "cuda" and dtype == torch.bfloat16
        and not torch.cuda.is_bf16_supported()):
        raise ValueError("this GPU has no bfloat16 support; use precision 'float16' "
                         "(with a GradScaler) instead.")
    return torch.autocast(device_type, dtype=dtype)


def dtype_name(dtype):
    """'bfloat16' for torch.bfloat16."""
    return str(dtype).removeprefix("torch.")


class DtypeCounter(TorchDispatchMode):
    """Counts (ATen operation, dtype of its first output) for every operation that runs
    under it.

    Left out: views, in-place and ``out=`` operations (any whose result aliases an
    input, such as a dropout mask filled in place).

    It sits below autocast in PyTorch's dispatcher, so it sees the operations as
    autocast ran them: an ``addmm`` on bfloat16 copies, and the copies themselves
    (``_to_copy``).
    """

    def __init__(self):
        super().__init__()
        self.counts = Counter()  # (op, output dtype) -> calls
        # (op, the distinct dtypes of its floating-point inputs, output dtype) -> calls
        self.signatures = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        is_view = any(r.alias_info is not None for r in func._schema.returns)
        outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        if outputs and not is_view and outputs[0].is_floating_point():
            name, output = func.overloadpacket.__name__, dtype_name(outputs[0].dtype)
            inputs = sorted({dtype_name(t.dtype) for t in tree_leaves((args, kwargs))
                             if isinstance(t, torch.Tensor) and t.is_floating_point()})
            self.counts[(name, output)] += 1
            self.signatures[(name, tuple(inputs), output)] += 1
        return out


def on_fake_tensors():
    """A context in which operations compute shapes and dtypes only, on fake tensors,
    and no arithmetic.

    Real inputs (a model's weights, a batch) are accepted and treated as fake
    (``allow_non_fake_inputs``). The bytes a step keeps and the dtype each operation
    returns depend on shapes and dtypes only, so lesson 1's meter and ``DtypeCounter``
    give the same figures inside it as in a real run (lesson 05 checks that on one
    batch).
    """
    return FakeTensorMode(allow_non_fake_inputs=True)


def has_fast_bfloat16_kernels(device_type="cpu"):
    """Whether bfloat16 matrix multiplies have a fast kernel on ``device_type`` ('cpu'
    or 'cuda').

    On a GPU: native bfloat16 support
    (``torch.cuda.is_bf16_supported(including_emulation=False)``; a GPU before Ampere
    only emulates bfloat16). On a CPU: oneDNN's bfloat16 path, which needs AVX-512 (BW,
    VL, DQ) or AVX-NE-CONVERT on x86, or the BF16 extension on ARM
    (``mkldnn_bf16_device_check`` in PyTorch's aten/src/ATen/native/mkldnn/Utils.h).
    Without it, PyTorch multiplies bfloat16 matrices in a generic loop that is many
    times slower than its float32 kernel (lesson 05 times both).
    """
    if device_type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported(
            including_emulation=False
        )
    if device_type != "cpu":
        raise ValueError("device_type must be 'cpu' or 'cuda' (a device's .type), "
                         f"got {device_type!r}")
    return (torch.backends.mkldnn.is_available()
            and torch.ops.mkldnn._is_mkldnn_bf16_supported())


class BFloat16MatmulsOnFloat32Kernels:
    """On a CPU, each bfloat16 mm, addmm, bmm and baddbmm computed by the float32
    kernel, rounded to bfloat16 once.

    The inputs are bfloat16 numbers, which float32 holds exactly; their products are
    exact in float32 (8 + 8 significant bits fit in 24), the sums accumulate in float32,
    and the result is rounded to bfloat16 once: what a bfloat16 matrix multiply with
    float32 accumulation computes, up to the order of the additions. Use it where
    ``has_fast_bfloat16_kernels()`` is False, so that training under bfloat16 autocast
    does not take the generic loop. While the block lasts, PyTorch's dispatcher calls
    this class's kernels instead of its own CPU kernels of those four operations
    (``torch.library.Library("aten", "IMPL")``, the documented way to override an
    operator from Python); they sit below autocast, so autocast still decides which
    operations run in bfloat16. Other dtypes go to PyTorch's own kernel (the ``out=``
    overload, which the block leaves alone). ``calls`` counts the multiplies it
    computed; the block affects the whole process, every thread.
    """

    MATMULS = ("mm", "addmm", "bmm", "baddbmm")

    def __init__(self):
        self.calls = 0
        self._library = None

    def _kernel(self, name):
        # PyTorch's own CPU kernel, writing into a given tensor
        into = getattr(torch.ops.aten, name).out

        def kernel(*args, **kwargs):
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            # mixed dtypes: PyTorch's error
            bfloat16 = all(t.dtype == torch.bfloat16 for t in tensors)
            if bfloat16:
                self.calls += 1
                args = [a.float() if isinstance(a, torch.Tensor) else a for a in args]
            dtype = torch.float32 if bfloat16 else tensors[0].dtype
            # resized by the kernel
            out = into(*args, **kwargs, out=torch.empty(0, dtype=dtype))
            return out.to(torch.bfloat16) if bfloat16 else out

        return kernel

    def __enter__(self):
        if self._library is not None:
            raise RuntimeError("this BFloat16MatmulsOnFloat32Kernels is already in "
                               "use: enter it once at a time, "
                               "or make a second one")
        self._library = torch.library.Library("aten", "IMPL")
        try:
            # the first override warns that it replaces PyTorch's kernel: meant
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for name in self.MATMULS:
                    self._library.impl(name, self._kernel(name), "CPU")
        except BaseException:  # none of the four stays overridden
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc_info):
        # PyTorch's own kernels again (as torch.library._scoped_library ends)
        self._library._destroy()
        self._library = None


# Operations a transformer step runs, each called on x, a (4, 8) activation, and w, an
# (8, 8) weight.
AUTOCAST_PROBES = {
    "linear, matmul": lambda x, w: torch.nn.functional.linear(x, w),
    "embedding": lambda x, w: torch.nn.functional.embedding(
        torch.zeros(4, dtype=torch.long, device=x.device), w),
    "GELU": lambda x, w: torch.nn.functional.gelu(x),
    "residual add": lambda x, w: x + x,
    "layer norm": lambda x, w: torch.nn.functional.layer_norm(x, x.shape[-1:]),
    "softmax": lambda x, w: torch.softmax(x, dim=-1),
    "exp, sum": lambda x, w: x.exp().sum(),
    "cross-entropy loss": lambda x, w: torch.nn.functional.cross_entropy(
        x, torch.zeros(4, dtype=torch.long, device=x.device)),
}
POLICIES = ("to bfloat16", "to float32", "follows its input")


@contextlib.contextmanager
def _autocast_state(device_type, dtype):
    """bfloat16 autocast switched on for ``device_type`` as ``torch.autocast`` does,
    without its availability check.

    ``torch.autocast("cuda")`` switches itself off where no GPU is visible; the
    dispatcher's autocast rules for CUDA are compiled into every PyTorch build all the
    same, and fake CUDA tensors reach them.
    """
    enabled, previous_dtype = (torch.is_autocast_enabled(device_type),
                               torch.get_autocast_dtype(device_type))
    torch.set_autocast_enabled(device_type, True)
    torch.set_autocast_dtype(device_type, dtype)
    torch.autocast_increment_nesting()
    try:
        yield
    finally:
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()
        torch.set_autocast_enabled(device_type, enabled)
        torch.set_autocast_dtype(device_type, previous_dtype)


def autocast_policy(device_type):
    """{operation: what bfloat16 autocast on ``device_type`` does to it}, measured, for
    AUTOCAST_PROBES.

    Each operation runs twice under autocast, on float32 inputs and on bfloat16 inputs:
    "to bfloat16" if the float32 inputs came out bfloat16 (autocast's lower-precision
    list), "to float32" if the bfloat16 inputs came out float32 (its float32 list), else
    "follows its input" (on neither list). It runs on fake tensors of that device type,
    so 'cuda' is measured on a machine without a GPU too: the rules are the
    dispatcher's, in PyTorch's aten/src/ATen/autocast_mode.cpp, compiled into every
    build.
    """
    if device_type not in ("cpu", "cuda"):
        raise ValueError(f"device_type must be 'cpu' or 'cuda', got {device_type!r}")
    policy = {}
    with FakeTensorMode(allow_non_fake_inputs=True), warnings.catch_warnings():
        # fake CUDA tensors on a build without CUDA warn once
        warnings.simplefilter("ignore")
        for name, probe in AUTOCAST_PROBES.items():
            out = {}
            for dtype in (torch.float32, torch.bfloat16):
                x = torch.empty(4, 8, dtype=dtype, device=device_type)
                w = torch.empty(8, 8, dtype=dtype, device=device_type)
                with _autocast_state(device_type, torch.bfloat16):
                    out[dtype] = probe(x, w).dtype
            policy[name] = ("to bfloat16" if out[torch.float32] == torch.bfloat16
                            else "to float32" if out[torch.bfloat16] == torch.float32
                            else "follows its input")
    return policy


def bfloat16_matmul_kernel(device_type="cpu"):
    """Which kind of kernel multiplies bfloat16 matrices on ``device_type``, in a few
    words a learner reads.

    One of: "a GPU's tensor cores" (native bfloat16, Ampere on), "emulated on this GPU",
    "AMX" (a CPU's matrix unit), "oneDNN's AVX512-BF16 kernel", "oneDNN's ARM BF16
    kernel", "oneDNN's kernel, no bfloat16 multiply instructions" (AVX-512 or
    AVX-NE-CONVERT alone), "the generic loop" (``has_fast_bfloat16_kernels`` is False).
    """
    if device_type == "cuda":
        return ("a GPU's tensor cores" if has_fast_bfloat16_kernels("cuda")
                else "emulated on this GPU")
    if not has_fast_bfloat16_kernels(device_type):
        return "the generic loop"
    capabilities = torch.cpu.get_capabilities()
    if capabilities.get("amx_bf16"):
        return "AMX"
    if capabilities.get("avx512_bf16"):
        return "oneDNN's AVX512-BF16 kernel"
    if capabilities.get("bf16") or capabilities.get("sve_bf16"):  # ARM's BF16 extension
        return "oneDNN's ARM BF16 kernel"
    return "oneDNN's kernel, no bfloat16 multiply instructions"
