#!/bin/bash
# pptrain under OpenMPI's (or MPICH's) mpirun, no wrapper: each rank reads OMPI_COMM_WORLD_RANK
# and OMPI_COMM_WORLD_SIZE (MPICH: PMI_RANK, PMI_SIZE); rank 0's host is MASTER_ADDR (or
# `pptrain train --master-addr`), needed when the ranks are on several hosts. On one host it is
# 127.0.0.1. MPI itself carries no data: the ranks talk through Gloo.
#
#   bash examples/cluster/mpirun.sh HOSTFILE MASTER_HOST
set -euo pipefail
hostfile=$1 master=$2

mpirun -np 4 --hostfile "$hostfile" -x MASTER_ADDR="$master" -x MASTER_PORT=29500 \
  pptrain train --model gpt --layers 8 --d-model 256 --heads 4 --seq-len 128 \
  --pp 4 --schedule zb-h1 --microbatches 8 --batch-size 8 --steps 200 --threads 4
