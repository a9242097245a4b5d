#!/bin/sh
# check-cuda.sh MAJOR.MINOR
#
# Build-time guard of the GPU images: the base's torch is built with the CUDA
# the image declares (its label org.grpo-deploy.cuda-version, which preflight
# compares with the host's NVIDIA driver), and a TRITON_PTXAS_PATH the image
# sets points at a ptxas that exists.
set -eu

want=${1:?usage: check-cuda.sh MAJOR.MINOR}
found=$(python3 -c 'import torch; print(torch.version.cuda or "none")' 2>/dev/null | tail -n 1)
if [ "$found" != "$want" ]; then
    echo "check-cuda.sh: the base's torch is built with CUDA ${found:-?}, the image declares $want (ARG CUDA)" >&2
    exit 1
fi
if [ -n "${TRITON_PTXAS_PATH:-}" ] && [ ! -x "$TRITON_PTXAS_PATH" ]; then
    echo "check-cuda.sh: TRITON_PTXAS_PATH=$TRITON_PTXAS_PATH is not an executable in this base" >&2
    exit 1
fi
echo "ok: torch built with CUDA $found${TRITON_PTXAS_PATH:+, ptxas $TRITON_PTXAS_PATH}"
