"""Each folder's README names every file in it (STYLE.md: a short README per folder, one
line per file), and the bug-report form asks what a report needs.

A folder with a README.md answers for the files below it, except those below a subfolder
with its own README, which it names as ``sub/``. A file is named when its path from the
README's folder appears in backticks, or a folder above it does (```tokenizer/```), or a
pattern does: ``NN`` and ``0N`` stand for digits, ``<name>`` for any name, ``{a,b}`` for
either. Files git ignores (the venv, build/, caches) are not the READMEs' business.
.github/ has no README, since GitHub would show it as the repository's front page: the
root README names its files.
"""
import fnmatch
import re
import subprocess

import pytest
import yaml  # PyYAML, a dependency of transformers

from helpers.paths import REPO_ROOT

BUG_REPORT = REPO_ROOT / ".github" / "ISSUE_TEMPLATE" / "bug_report.yml"


def repository_files():
    """Every file of the working tree that git does not ignore, relative to the root."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO_ROOT, capture_output=True, text=True)
    if listed.returncode == 0:
        paths = [p for p in listed.stdout.split("\0") if p]
        return sorted(p for p in paths if (REPO_ROOT / p).is_file())
    # not a git checkout (a downloaded archive): .gitignore's patterns, read simply
    patterns = [line.strip().rstrip("/") for line in
                (REPO_ROOT / ".gitignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")] + [".git"]
    def ignored(path):
        return any(fnmatch.fnmatch(part, pattern) for pattern in patterns
                   for part in path.relative_to(REPO_ROOT).parts)

    paths = [p for p in REPO_ROOT.rglob("*") if p.is_file() and not ignored(p)]
    return sorted(path.relative_to(REPO_ROOT).as_posix() for path in paths)


def pattern_regex(name):
    """A backticked name as a regex: NN, 0N, <name> and {a,b} are placeholders."""
    regex = re.escape(name)
    regex = re.sub(r"\\\{([^}]*)\\\}",
                   lambda m: "(?:" + "|".join(m.group(1).split(",")) + ")", regex)
    regex = re.sub(r"<[^>]*>", "[^/]+", regex)
    regex = regex.replace("NN", r"\d\d").replace("0N", r"0\d")
    return re.compile(regex + "(?:/.*)?")  # a folder names what is below it


def unnamed(readme_text, files):
    """The files (paths relative to the README's folder) that the README does not
    name."""
    names = [pattern_regex(name.rstrip("/"))
             for name in re.findall(r"`([^`\s][^`]*)`", readme_text)]
    return [f for f in files if not any(name.fullmatch(f) for name in names)]


def readme_folders(files):
    return sorted({path.rsplit("/", 1)[0] if "/" in path else ""
                   for path in files if path.rsplit("/", 1)[-1] == "README.md"})


def files_answered_for(folder, folders, files):
    """The paths (relative to ``folder``) its README must name: its files, and ``sub/``
    for a subfolder with a README of its own (whose files that README names)."""
    prefix = folder + "/" if folder else ""
    inner = [f for f in folders if f != folder and f.startswith(prefix)]
    answered = set()
    for path in files:
        if not path.startswith(prefix) or path == prefix + "README.md":
            continue
        owner = next((f for f in inner if path.startswith(f + "/")), None)
        if owner is None:
            answered.add(path[len(prefix):])
        elif "/" not in owner[len(prefix):]:  # a direct subfolder with its own README
            answered.add(owner[len(prefix):] + "/")
        else:  # deeper: named as the direct subfolder above it, if it has no README
            answered.add(owner[len(prefix):].split("/")[0] + "/")
    return sorted(answered)


FILES = repository_files()
FOLDERS = readme_folders(FILES)


@pytest.mark.parametrize("folder", FOLDERS, ids=[f or "(root)" for f in FOLDERS])
def test_each_readme_names_every_file_in_its_folder(folder):
    readme = REPO_ROOT / folder / "README.md"
    missing = unnamed(readme.read_text(), files_answered_for(folder, FOLDERS, FILES))
    assert not missing, f"{readme.relative_to(REPO_ROOT)} does not name {missing}"


def test_the_folders_with_a_readme():
    assert FOLDERS == ["", ".ci", "data", "helpers", "helpers/practice", "locales",
                       "notebooks", "tests", "tools"]


def test_an_unnamed_file_is_found_and_patterns_name_files():
    readme = "- `check_<lesson>.py`: ...\n- `practice/NN_<lesson>_solution.ipynb`\n" \
             "- `paraphrase/{train,test}.jsonl` and `tokenizer/`"
    files = ["check_adamw.py", "practice/04_adamw_solution.ipynb",
             "paraphrase/test.jsonl",
             "tokenizer/vocab.txt", "paraphrase/validation.jsonl", "adamw.py",
             "practice/4_adamw_solution.ipynb"]
    assert unnamed(readme, files) == ["paraphrase/validation.jsonl", "adamw.py",
                                      "practice/4_adamw_solution.ipynb"]


def test_the_bug_report_asks_for_the_machine_and_the_set_up_output():
    form = yaml.safe_load(BUG_REPORT.read_text())
    fields = {item["id"]: item for item in form["body"] if "id" in item}
    assert {"operating-system", "where-you-run", "python-version", "torch-version",
            "set-up-cell-output"} <= set(fields)
    where = " ".join(fields["where-you-run"]["attributes"]["options"])
    assert all(place in where for place in ("laptop", "Colab", "cluster"))
    asked = fields["set-up-cell-output"]["attributes"]["description"]
    assert "00_start_here.ipynb" in asked
    assert all(item.get("validations", {}).get("required") for item in fields.values())
