"""JupyterLab's first start asks nothing that is not about the course: the project's
settings, in force."""
import json
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from helpers.paths import REPO_ROOT

OVERRIDES = REPO_ROOT / "tools" / "jupyterlab_overrides.json"
TOKEN = "course-test"


@pytest.fixture(scope="module")
def lab_server(tmp_path_factory):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--allow-root",
         f"--port={port}", "--ServerApp.ip=127.0.0.1",
         f"--IdentityProvider.token={TOKEN}",
         f"--notebook-dir={REPO_ROOT / 'notebooks'}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=tmp_path_factory.mktemp("lab"),
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while True:
        try:
            urllib.request.urlopen(f"{url}/api/status?token={TOKEN}", timeout=2)
            break
        except OSError:
            if time.time() > deadline or process.poll() is not None:
                process.kill()
                raise RuntimeError("jupyter lab did not start within 60 s") from None
            time.sleep(0.3)
    yield url
    process.terminate()
    process.wait(timeout=30)


def defaults(lab_server, plugin):
    """The defaults the running server gives ``plugin``'s settings: the schema's, with
    overrides.json applied."""
    with urllib.request.urlopen(
        f"{lab_server}/lab/api/settings/{plugin}?token={TOKEN}", timeout=10
    ) as answer:
        properties = json.load(answer)["schema"]["properties"]
    return {name: spec.get("default") for name, spec in properties.items()}


def test_the_news_and_update_prompts_are_off_in_a_running_jupyterlab(lab_server):
    settings = defaults(lab_server, "@jupyterlab/apputils-extension:notification")
    # the schema's default "none" asks the learner on first start
    assert settings["fetchNews"] == "false"
    assert settings["checkForUpdates"] is False


def test_every_override_names_a_real_setting():
    schemas = REPO_ROOT / ".venv" / "share" / "jupyter" / "lab" / "schemas"
    for plugin, values in json.loads(OVERRIDES.read_text()).items():
        package, name = plugin.rsplit(":", 1)
        schema = json.loads((schemas / package / f"{name}.json").read_text())
        assert set(values) <= set(schema["properties"]), plugin
