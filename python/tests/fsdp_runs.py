"""Driver: several FSDP2 training runs of examples/fsdp2_train.py in one
launch (one process group), each given as one argument holding its flags
separated by spaces."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import fsdp2_train  # noqa: E402

sys.exit(fsdp2_train.run([a.split() for a in sys.argv[1:]]))
