"""Where the worker processes of lesson 03's launcher meet: a TCP port on the loopback
interface (one room of ``helpers.launcher``).

PyTorch's launchers meet on ``$MASTER_PORT``, else on 29500, where every other launch on
the machine meets too: two notebooks (or two test workers) launching at the same moment
both took 29500 ("address already in use", in 16 of 108 launches made side by side). So
a launch takes ``$MASTER_PORT`` when it is set, else a port free at that moment; the
launcher starts again on another when one is taken before its processes listen
(``PORT_ATTEMPTS``, tested by
``test_a_port_taken_before_the_processes_listen_on_it_is_replaced``).
"""
import os
import socket

# launches started again when another program took their port first
PORT_ATTEMPTS = 3


def default_port():
    """``$MASTER_PORT`` if set, else None: a port free now (PyTorch's usual 29500 is
    where every other launch on the machine meets too)."""
    value = os.environ.get("MASTER_PORT")
    if value is None:
        return None
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise ValueError("MASTER_PORT must be a TCP port number (1-65535), "
                         f"got {value!r}; "
                         "unset it to use a free port, or pass port= to choose one")
    return int(value)


def free_port():
    """A TCP port that nothing listens on now, for the processes to meet at."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_is_busy(port):
    """Whether something already listens on ``port`` of the loopback interface."""
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", int(port))) == 0


def is_port_taken(error):
    """Whether a launch failed because another program listened on its port first
    (torch's ``DistNetworkError`` names EADDRINUSE)."""
    return "EADDRINUSE" in str(error)


def require_loopback():
    """The processes meet on 127.0.0.1: fail now, clearly, rather than wait for a
    rendezvous that cannot happen (in a network namespace made with ``unshare -n``,
    ``lo`` is down and the rendezvous would wait its whole timeout)."""
    try:
        with socket.socket() as server:
            server.bind(("127.0.0.1", 0))
            server.listen()
            socket.create_connection(server.getsockname(), timeout=2).close()
    except OSError as error:
        raise RuntimeError(
            "the worker processes talk over the loopback interface (127.0.0.1), "
            "which does not answer here "
            f"({error}). In a network namespace made with `unshare -n`, bring it up "
            "first: ip link set lo up") from None
