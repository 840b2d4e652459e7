"""Where the course's files are, and how to remake them (introduced in
00_start_here)."""
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = REPO_ROOT / "data"
REGENERATE_COMMAND = "python data/make_data.py  (run it from the repository root)"
