"""The scripts of tools/ for the tests: a folder of scripts, not a package on the import
path, so each is loaded by its path (tools/bench.py -> load_tool("bench"))."""
import importlib.util

from helpers.paths import REPO_ROOT


def load_tool(name):
    """The script tools/<name>.py, loaded as a module."""
    spec = importlib.util.spec_from_file_location(
        name, REPO_ROOT / "tools" / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
