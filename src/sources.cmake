# src/: the communicator and its transports (docs/design.md "Transports").
list(APPEND ZPP_C_SOURCES
  src/comm.c
  src/comm_create.c     # creation over any bootstrap, subsets
  src/bootstrap_tcp.c   # zpp's own TCP bootstrap (unique id, torchrun env)
  src/comm_mpi.c        # the MPI adapter
  src/transport.c
  src/transport_algo.c
  src/transport_mpi.c
  src/transport_nccl.c
  src/transport_ucx.c
  src/runtime.c) # parameter groups for a ZeRO runtime (docs/runtime.md)
