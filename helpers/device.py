"""Where the lessons run, and proof that they need no network (introduced in
00_start_here)."""
import contextlib
import importlib.metadata
import os
import platform
import re
import socket

import torch

from helpers.paths import REPO_ROOT

# oldest and newest minor version the course supports
SUPPORTED_PYTHON = ((3, 11), (3, 13))
CHECKED_PACKAGES = ("torch", "transformers", "accelerate", "datasets", "bitsandbytes")


def get_device():
    """The device of lessons 01, 02, 04 and 05: the first CUDA GPU when there is one,
    else the CPU.

    Lesson 03's worker processes choose their own, in
    ``helpers.launcher.worker_accelerator``.
    """
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def device_name(device=None):
    """The name of the machine a measurement ran on, without host or user names: the
    GPU's name (``torch.cuda.get_device_name``), else the CPU's as PyTorch reports it
    (``torch.cpu.get_capabilities()["cpu_name"]``, e.g. "Intel Xeon"), else the
    architecture (introduced in lesson 05, whose figures name the machine of each bar).
    """
    device = torch.device(device) if device is not None else get_device()
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type != "cpu":
        raise ValueError(f"device_name names a 'cpu' or 'cuda' device, got {device}")
    return torch.cpu.get_capabilities().get("cpu_name") or platform.machine()


def environment_report():
    """Versions and hardware that the lessons' measurements depend on, as a dict."""
    import accelerate
    import datasets
    import transformers

    device = get_device()
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "accelerate": accelerate.__version__,
        "datasets": datasets.__version__,
        # read, not imported: its import logs
        "bitsandbytes": importlib.metadata.version("bitsandbytes"),
        "device": device.type,
        "gpu_name": torch.cuda.get_device_name(0) if device.type == "cuda" else None,
        "cpu_architecture": platform.machine(),
        # os.cpu_count counts logical CPUs (hardware threads)
        "logical_cpus": os.cpu_count(),
    }


def torch_build():
    """Which build of torch this is, and the GPUs it sees, e.g. "CUDA 13.0, no GPU
    visible", for a bug report.

    The build is what torch was compiled for (``torch.version``), not what the machine
    has: pip's torch for Linux is a CUDA build, and runs every lesson on the CPU where
    it sees no GPU.
    """
    if torch.version.cuda:
        build = f"CUDA {torch.version.cuda}"
    elif torch.version.hip:
        build = f"ROCm {torch.version.hip}"
    elif getattr(torch.version, "xpu", None):
        build = f"XPU {torch.version.xpu}"
    elif torch.backends.mps.is_built():
        build = "CPU, with Apple's MPS"
    else:
        build = "CPU only"
    # CUDA's or ROCm's; asks NVML, so it does not initialise CUDA
    gpus = torch.cuda.device_count()
    if gpus:
        seen = f"{gpus} GPU{'s' if gpus > 1 else ''} visible"
    elif torch.backends.mps.is_available():
        seen = "Apple GPU visible (the lessons use the CPU)"
    else:
        seen = "no GPU visible"
    return f"{build}, {seen}"


def pinned_versions(requirements=REPO_ROOT / "requirements.txt"):
    """{package: version} of every ``name==version`` line in requirements.txt."""
    pins = re.findall(
        r"^([A-Za-z0-9_.-]+)==([^\s#]+)", requirements.read_text(), flags=re.MULTILINE
    )
    return {name.lower(): version for name, version in pins}


def version_checks(report=None, pins=None):
    """One line per check: Python in the supported range, each lesson library at its
    pinned version.

    The lines hold no machine detail (a CUDA build's ``+cu126`` suffix is dropped), so
    they read the same on every machine where the set-up is right, and say what to do
    where it is not.
    """
    report = report or environment_report()
    pins = pins or pinned_versions()
    (oldest, newest), python = (
        SUPPORTED_PYTHON,
        tuple(int(part) for part in report["python"].split(".")[:2]),
    )
    supported = f"{oldest[0]}.{oldest[1]} to {newest[0]}.{newest[1]}"
    lines = [f"python: supported ({supported})" if oldest <= python <= newest else
             f"python: {report['python']} is not supported: use Python {supported}"]
    for package in CHECKED_PACKAGES:
        installed = report[package].split("+")[0]
        lines.append(f"{package}: {installed}, as pinned" if installed == pins[package]
                     else f"{package}: {installed}, but requirements.txt pins "
                     f"{pins[package]}: run `make lab` again")
    return lines


class NetworkBlockedError(OSError):
    """Raised by any connection attempted inside ``no_network()``."""


@contextlib.contextmanager
def no_network():
    """Make Python's socket connections fail at once, to prove a step works offline.

    ``socket.socket.connect``, ``connect_ex`` and ``socket.create_connection`` raise
    inside the block; a name lookup, or code that reaches the network without Python's
    ``socket`` module, is not blocked.
    """
    def refuse(*args, **kwargs):
        raise NetworkBlockedError("network access attempted inside no_network()")

    saved = socket.socket.connect, socket.socket.connect_ex, socket.create_connection
    socket.socket.connect = refuse
    socket.socket.connect_ex = refuse
    socket.create_connection = refuse
    try:
        yield
    finally:
        socket.socket.connect, socket.socket.connect_ex, socket.create_connection = (
            saved
        )
