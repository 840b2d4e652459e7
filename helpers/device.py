"""Where the lessons run, and proof that they need no network (introduced in 00_start_here)."""
import contextlib
import os
import platform
import socket

import torch


def get_device():
    """The device every lesson trains on: the first CUDA GPU when there is one, else the CPU."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


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
        "device": device.type,
        "device_name": torch.cuda.get_device_name(0) if device.type == "cuda" else platform.machine(),
        "cpu_cores": os.cpu_count(),
    }


class NetworkBlockedError(OSError):
    """Raised by any connection attempted inside ``no_network()``."""


@contextlib.contextmanager
def no_network():
    """Make every socket connection fail at once, to prove a step works offline."""
    def refuse(*args, **kwargs):
        raise NetworkBlockedError("network access attempted inside no_network()")

    saved = socket.socket.connect, socket.socket.connect_ex, socket.create_connection
    socket.socket.connect = refuse
    socket.socket.connect_ex = refuse
    socket.create_connection = refuse
    try:
        yield
    finally:
        socket.socket.connect, socket.socket.connect_ex, socket.create_connection = saved
