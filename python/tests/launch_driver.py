"""Multi-rank driver of test_launch.py: zpp.init_process_group("gloo"),
then an all_reduce checked against its closed form.  Rank 0 prints one
JSON line: the rendezvous it ended up with (MASTER_ADDR, MASTER_PORT),
whether that port is listening (the store's), the variables it filled
and the sum.  Exits non-zero on a failed check.  With ZPP_TEST_EXPECT_FAIL
every rank (under mpirun) prints the error init_process_group raised
instead."""
import json
import os
import socket

import torch
import torch.distributed as dist

import zpp


def listening(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def main():
    if os.environ.get("ZPP_TEST_EXPECT_FAIL"):
        # each rank says what it got, so that the test sees every rank
        # (mpirun ends the others once one exits non-zero)
        me = os.environ["OMPI_COMM_WORLD_RANK"]
        try:
            zpp.init_process_group("gloo")
        except RuntimeError as e:
            # a failed call writes no RANK (a retry would take it for torchrun's)
            print("rank %s failed: %s%s" % (me, e, "; RANK was written" * ("RANK" in os.environ)),
                  flush=True)
            return
        raise SystemExit("rank %s: init_process_group succeeded" % me)
    zpp.init_process_group("gloo")
    r, w = dist.get_rank(), dist.get_world_size()
    assert (r, w) == (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])), (r, w)
    # rank r contributes (r + 1) * [1, 2, 3]: the sum is w (w + 1) / 2 * [1, 2, 3]
    t = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64) * (r + 1)
    dist.all_reduce(t)
    want = w * (w + 1) / 2 * torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    assert torch.equal(t, want), (t, want)
    port = int(os.environ["MASTER_PORT"])
    if r == 0:
        print(json.dumps({"world": w, "sum": t.tolist(), "master_addr": os.environ["MASTER_ADDR"],
                          "master_port": port, "port_listening": listening(port),
                          "local_rank": os.environ["LOCAL_RANK"]}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
