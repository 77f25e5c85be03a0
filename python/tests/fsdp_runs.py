"""Driver: several FSDP2 training runs of examples/fsdp2_train.py in one
launch (one process group), each given as one argument holding its flags
separated by spaces; the argument "hook-ops" runs hook_ops.check() there
instead (one JSON line {"hook_ops": {check: "ok" or what failed on which
rank}}), and "enable-modes" enable_modes.check() (one JSON line
{"enable_modes": ...}), before the runs."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import fsdp2_train  # noqa: E402


def _hook_ops() -> None:
    import torch.distributed as dist

    import hook_ops

    seen = hook_ops.check()
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, seen)
    merged = {}
    for r, s in enumerate(every):
        for k, v in s.items():
            if v != "ok" or k not in merged:
                merged[k] = v if v == "ok" else "rank %d: %s" % (r, v)
    if dist.get_rank() == 0:
        print(json.dumps({"hook_ops": merged}), flush=True)


def _before() -> None:
    if "hook-ops" in args:
        _hook_ops()
    if "enable-modes" in args:
        import enable_modes

        enable_modes.check()


args = sys.argv[1:]
named = ("hook-ops", "enable-modes")
sys.exit(fsdp2_train.run([a.split() for a in args if a not in named],
                         before=_before if any(a in named for a in args) else None))
