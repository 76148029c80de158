import sys
from pathlib import Path

# The test helpers (tests/lab.py, tests/wandb_records.py) import as top-level modules.
sys.path.insert(0, str(Path(__file__).resolve().parent))
