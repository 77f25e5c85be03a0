# src/: the communicator and its transports (docs/design.md "Transports").
list(APPEND ZPP_C_SOURCES
  src/comm.c
  src/comm_mpi.c
  src/transport.c
  src/transport_algo.c
  src/transport_mpi.c
  src/transport_nccl.c
  src/runtime.c) # parameter groups for a ZeRO runtime (docs/runtime.md)
