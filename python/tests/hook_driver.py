"""World-1 driver of test_fsdp.py: the hooks called directly with inputs
FSDP2 would never give zpp, which must raise exceptions naming the problem."""
import json

import torch
import torch.distributed as dist

import zpp
import zpp.fsdp

dist.init_process_group("gloo")
comms = zpp.fsdp.Comms()
opts = zpp.fsdp.Options(qwz_bits=8, qgz_bits=4, error_feedback=True)
ag, rs = zpp.fsdp.AllGather(comms, opts), zpp.fsdp.ReduceScatter(comms, opts)
g = dist.group.WORLD
seen = {}
for name, call, exc, pat in [
    ("meta device", lambda: ag(torch.empty(4, device="meta"), torch.empty(4, device="meta"), g),
     zpp.DeviceError, "meta"),
    ("float64 gather", lambda: ag(torch.zeros(4, dtype=torch.float64), torch.zeros(4, dtype=torch.float64), g),
     zpp.DtypeError, "torch.float64"),
    ("int32 reduce", lambda: rs(torch.zeros(4, dtype=torch.int32), torch.zeros(4, dtype=torch.int32), g,
                                dist.ReduceOp.SUM), zpp.DtypeError, "torch.int32"),
    ("MAX op", lambda: rs(torch.zeros(4), torch.zeros(4), g, dist.ReduceOp.MAX), ValueError, "MAX"),
]:
    try:
        call()
        seen[name] = "no exception"
    except exc as e:
        seen[name] = "ok" if pat in str(e) else "message without %r: %s" % (pat, e)
# and the valid call still works afterwards
x = torch.randn(8)
out = torch.empty(8)
ag(out, x, g)
seen["valid after"] = "ok" if torch.equal(out, zpp.quant.decode(zpp.quant.encode(x), 8)) or torch.equal(out, x) else "wrong"
# async_op: a dist.Work (FSDP2 waits only on those) whose wait finishes it
out2 = torch.empty(8)
w = ag(out2, x, g, async_op=True)
seen["async is a dist.Work"] = "ok" if isinstance(w, dist.distributed_c10d.Work) else repr(type(w))
w.wait()
seen["async result"] = "ok" if torch.equal(out2, out) else "wrong"
comms.close()
print(json.dumps(seen), flush=True)
dist.destroy_process_group()
