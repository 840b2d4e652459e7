"""Install requirements.txt's torch from another wheel index:
`make install TORCH_INDEX=...` runs it.

Run with the virtual environment's Python, before `pip install -r requirements.txt`. On
Linux the package index's torch is a CUDA build (a 5.7 GB environment instead of 1.9 GB,
GPU or not); PyTorch's CPU wheel index, https://download.pytorch.org/whl/cpu, has the
CPU build of the same version (`2.13.0+cpu`), and requirements.txt's `torch==2.13.0`
accepts it, so the requirements install keeps it.

- The choice is remembered in the environment (``.torch-index``): a later `make test`
  without TORCH_INDEX keeps this torch, a reinstall without it (requirements.txt
  changed) takes torch from the same index, and the same TORCH_INDEX again installs
  nothing. Another index replaces torch itself. With no index given and none remembered,
  it does nothing: pip takes the package index's torch with the other requirements.
- An index that cannot be reached fails in seconds, with what to do: the index is asked
  for its torch page first (``--timeout`` seconds), and pip itself runs with that
  timeout and one retry.
"""
import argparse
import importlib
import importlib.metadata
import os
import re
import socket
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

REQUIREMENTS = Path(__file__).resolve().parent.parent / "requirements.txt"
# in the virtual environment: the index torch came from
CHOICE = Path(sys.prefix) / ".torch-index"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


class UnusableIndex(Exception):
    """The index cannot serve torch: the message says why."""


def pinned_torch(requirements=REQUIREMENTS):
    """The version requirements.txt pins, e.g. "2.13.0"."""
    match = re.search(r"^torch==([^\s#]+)", requirements.read_text(),
                      flags=re.MULTILINE)
    if not match:
        raise SystemExit(f"{requirements} pins no torch==VERSION")
    return match.group(1)


def installed_torch():
    """The installed torch's version (e.g. "2.13.0+cpu"), or None; read from its
    metadata, not imported."""
    importlib.invalidate_caches()
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def check_reachable(index, timeout):
    """Raise UnusableIndex unless the index answers for torch's page (PEP 503:
    INDEX/torch/) in time."""
    page = index.rstrip("/") + "/torch/"
    parsed = urllib.parse.urlparse(page)
    if parsed.scheme == "file":
        folder = Path(urllib.request.url2pathname(parsed.path))
        if not folder.is_dir():
            raise UnusableIndex(f"there is no folder {folder}")
        return
    if parsed.scheme not in ("http", "https"):
        raise UnusableIndex("it is not an http://, https:// or file:// address")
    try:
        with urllib.request.urlopen(page, timeout=timeout):
            pass
    except urllib.error.HTTPError as error:
        if error.code == 404:
            raise UnusableIndex(f"it has no torch page ({page} answers 404): "
                                "is it a wheel index?") from None
        raise UnusableIndex(f"{page} answers HTTP {error.code}") from None
    except urllib.error.URLError as error:
        if "CERTIFICATE" in str(error.reason).upper():
            # pip has certificates of its own (and its configuration's): let it try,
            # with its timeout
            return
        raise UnusableIndex(f"{error.reason}") from None
    except (socket.timeout, TimeoutError):
        raise UnusableIndex(f"no answer within {timeout:g} s") from None
    except OSError as error:
        raise UnusableIndex(str(error)) from None


def leftover_cuda_packages():
    """Names of installed CUDA runtime packages (a CUDA build's dependencies)."""
    importlib.invalidate_caches()
    names = {dist.metadata["Name"].lower()
             for dist in importlib.metadata.distributions()}
    return sorted(name for name in names
                  if name.startswith(("nvidia-", "cuda-")) or name == "triton")


def main(argv=None):
    # the docstring's first paragraph (its first sentence, wrapped)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--index-url", default="",
                        help="a wheel index (PEP 503), e.g. " + CPU_INDEX +
                        "; empty: the one remembered in this environment, if any")
    parser.add_argument("--timeout", type=float, default=20,
                        help="seconds to wait for the index (default 20)")
    args = parser.parse_args(argv)
    chosen = CHOICE.read_text().strip() if CHOICE.exists() else None
    index, version = args.index_url.strip() or chosen, pinned_torch()
    if not index:
        return 0  # the package index's torch, installed with the other requirements
    before = installed_torch()
    if chosen == index and before and before.split("+")[0] == version:
        print(f"torch {before} from {index}: installed already")
        return 0
    try:
        check_reachable(index, args.timeout)
    except UnusableIndex as error:
        print(f"\nmake install: cannot use TORCH_INDEX={index}: {error}.\n"
              "Check the address and your network (or proxy). "
              f"PyTorch's CPU builds are at {CPU_INDEX}.\n"
              "Or leave TORCH_INDEX out: pip then installs the package index's torch "
              "(on Linux a CUDA build, about 4 GB more).", file=sys.stderr)
        return 2
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--index-url", index,
               "--timeout", f"{args.timeout:g}", "--retries", "1", f"torch=={version}"]
    # another build of torch is installed: replace torch itself, keep what it depends on
    if before:
        command[4:4] = ["--force-reinstall", "--no-deps"]
    print(f"installing torch=={version} from {index}"
          + (f" instead of torch {before}" if before else ""))
    if subprocess.run(command).returncode != 0:
        print(f"\nmake install: pip could not install torch=={version} "
              f"from TORCH_INDEX={index} (see above).\n"
              f"The index must offer torch {version} for this Python and platform; "
              f"PyTorch's CPU builds are at {CPU_INDEX}. "
              "Or leave TORCH_INDEX out to install the package index's torch.",
              file=sys.stderr)
        return 1
    after = installed_torch()
    CHOICE.write_text(index + "\n")
    print(f"torch {after} installed from {index}")
    leftovers = (leftover_cuda_packages() if before and "+cu" not in (after or "")
                 else [])
    if leftovers:
        print("The CUDA libraries the previous torch needed are still installed "
              f"({len(leftovers)} packages); to free their space: "
              f"rm -rf {os.path.relpath(sys.prefix)} "
              f"&& make install TORCH_INDEX={index}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
