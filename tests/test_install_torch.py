"""`make install TORCH_INDEX=...` (tools/install_torch.py), tested on local wheel
indexes: folders served as file:// and holding a small stand-in torch wheel made here,
in a virtual environment of their own."""
import base64
import hashlib
import os
import socket
import subprocess
import sys
import threading
import time
import zipfile

import pytest

from helpers.paths import REPO_ROOT

SCRIPT = REPO_ROOT / "tools" / "install_torch.py"
PINNED = "2.13.0"


def record_hash(text):
    """A file's hash as a wheel's RECORD writes it: urlsafe base64, without padding."""
    digest = hashlib.sha256(text.encode()).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b'=').decode()


def stand_in_wheel(folder, version):
    """A wheel named torch, of ``version``, holding only ``torch.__version__``: no
    dependencies."""
    files = {"torch/__init__.py": f"__version__ = {version!r}\n",
             f"torch-{version}.dist-info/METADATA":
                 f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n",
             f"torch-{version}.dist-info/WHEEL":
                 "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                 "Tag: py3-none-any\n"}
    record = [f"{name},sha256={record_hash(text)},"
              f"{len(text.encode())}" for name, text in files.items()]
    files[f"torch-{version}.dist-info/RECORD"] = "\n".join(
        record + [f"torch-{version}.dist-info/RECORD,,"]) + "\n"
    path = folder / f"torch-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
    return path


def local_index(folder, *versions):
    """A PEP 503 index in ``folder`` (torch/index.html and its wheels), as a file://
    URL."""
    (folder / "torch").mkdir(parents=True)
    links = [stand_in_wheel(folder / "torch", version).name for version in versions]
    (folder / "torch" / "index.html").write_text(
        "<html><body>" + "".join(f'<a href="{name}">{name}</a>' for name in links)
        + "</body></html>")
    return folder.as_uri()


def pip_env():
    """This machine's pip settings left out (its config files and PIP_* variables): only
    the index asked."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("PIP_")}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    folder = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
    return folder / "bin" / "python"


def install(python, index, timeout=20):
    start = time.perf_counter()
    done = subprocess.run([str(python), str(SCRIPT), "--index-url", index,
                           "--timeout", str(timeout)],
                          capture_output=True, text=True, env=pip_env(), cwd=REPO_ROOT,
                          timeout=120)
    return done, time.perf_counter() - start


def torch_version(python):
    return subprocess.run([str(python), "-c", "import torch; print(torch.__version__)"],
                          capture_output=True, text=True, check=True).stdout.strip()


def test_torch_comes_from_the_index_and_the_pin_keeps_it(venv, tmp_path):
    index = local_index(tmp_path / "cpu", f"{PINNED}+cpu", "2.12.1+cpu")
    done, _ = install(venv, index)
    assert done.returncode == 0, done.stderr
    assert torch_version(venv) == f"{PINNED}+cpu"
    assert f"torch {PINNED}+cpu installed from {index}" in done.stdout
    # requirements.txt's torch==2.13.0 accepts the +cpu build: its install, offline,
    # changes nothing
    requirements = tmp_path / "requirements.txt"
    requirements.write_text(f"torch=={PINNED}\n")
    kept = subprocess.run([str(venv), "-m", "pip", "install", "--no-index",
                           "-r", str(requirements)],
                          capture_output=True, text=True, env=pip_env())
    assert (kept.returncode == 0
            and "Requirement already satisfied: torch" in kept.stdout), (
        kept.stdout + kept.stderr)
    # the same index again: nothing to do, and pip is not even asked
    again, seconds = install(venv, index)
    assert (again.returncode == 0 and "installed already" in again.stdout
            and seconds < 10)
    # a reinstall without TORCH_INDEX (requirements.txt changed) takes torch from the
    # remembered index
    subprocess.run([str(venv), "-m", "pip", "uninstall", "--yes", "torch"],
                   check=True, capture_output=True)
    remembered, _ = install(venv, "")
    assert remembered.returncode == 0 and torch_version(venv) == f"{PINNED}+cpu", (
        remembered.stderr)
    # another index replaces torch itself
    other = local_index(tmp_path / "cu130", f"{PINNED}+cu130")
    switched, _ = install(venv, other)
    assert switched.returncode == 0, switched.stderr
    assert f"instead of torch {PINNED}+cpu" in switched.stdout
    assert torch_version(venv) == f"{PINNED}+cu130"


def test_an_index_without_the_pinned_version_says_so(venv, tmp_path):
    done, seconds = install(venv, local_index(tmp_path / "old", "2.12.1+cpu"))
    assert done.returncode != 0 and seconds < 60
    assert f"pip could not install torch=={PINNED}" in done.stderr
    assert "leave TORCH_INDEX out" in done.stderr


@pytest.mark.parametrize("make_index",
                         ["missing folder", "folder without torch", "not a URL"])
def test_an_index_that_is_not_one_fails_at_once_with_what_to_do(make_index, venv,
                                                                tmp_path):
    index = {"missing folder": (tmp_path / "nowhere").as_uri(),
             "folder without torch": tmp_path.as_uri(),
             "not a URL": "download.pytorch.org/whl/cpu"}[make_index]
    done, seconds = install(venv, index)
    assert done.returncode == 2 and seconds < 10
    assert f"cannot use TORCH_INDEX={index}" in done.stderr
    assert "https://download.pytorch.org/whl/cpu" in done.stderr


def test_an_index_that_refuses_the_connection_fails_in_seconds(venv):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done, seconds = install(venv, f"http://127.0.0.1:{port}/whl/cpu")
    assert done.returncode == 2 and seconds < 10
    assert "refused" in done.stderr.lower() and "leave TORCH_INDEX out" in done.stderr


def test_an_index_that_never_answers_fails_after_the_timeout_not_a_hang(venv):
    # accepts connections, never answers: a hung server or a dropping firewall
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        held = []
        threading.Thread(target=lambda: held.append(silent.accept()),
                         daemon=True).start()
        done, seconds = install(venv, f"http://127.0.0.1:{port}/whl/cpu", timeout=2)
    assert done.returncode == 2 and seconds < 15
    assert "no answer within 2 s" in done.stderr or "timed out" in done.stderr


def test_make_install_runs_it_before_the_requirements_only_when_asked(tmp_path):
    def planned(*variables):
        return subprocess.run(["make", "-n", "install", f"VENV={tmp_path / 'venv'}",
                               *variables], cwd=REPO_ROOT, capture_output=True,
                              text=True, check=True).stdout.splitlines()

    asked = planned("TORCH_INDEX=file:///wheels")
    torch_line = next(i for i, line in enumerate(asked)
                      if "tools/install_torch.py --index-url 'file:///wheels'" in line)
    assert torch_line < next(i for i, line in enumerate(asked)
                             if "-r requirements.txt" in line)
    # without it, the script is asked for the remembered index only, and does nothing
    # where there is none
    assert any("install_torch.py --index-url ''" in line for line in planned())


def test_no_index_given_and_none_remembered_leaves_torch_to_the_requirements(tmp_path):
    subprocess.run([sys.executable, "-m", "venv", "--without-pip",
                    str(tmp_path / "venv")], check=True)
    # no pip there: it must not be needed
    done, seconds = install(tmp_path / "venv" / "bin" / "python", "")
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "") and seconds < 10
