"""torchrun driver of test_fsdp_errors.py: zpp.fsdp.enable() on a small
model with logging left unconfigured, one training step, close().  What
enable() logs goes to stderr; the test counts it."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard

import zpp.fsdp

dist.init_process_group("gloo")
torch.manual_seed(0)
m = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 8), nn.Linear(8, 1))
fully_shard(m[0])
fully_shard(m[1])
fully_shard(m)
z = zpp.fsdp.enable(m, qwz_bits=8, qwz_block=128, qgz_bits=4, error_feedback=True)
m(torch.randn(4, 8)).sum().backward()
calls = z.hook_calls()
assert calls.get("qwz float32", 0) > 0 and calls.get("qgz avg", 0) > 0, calls
z.close()
dist.destroy_process_group()
