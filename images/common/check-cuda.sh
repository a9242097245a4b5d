#!/bin/sh
# check-cuda.sh MAJOR.MINOR
#
# Build-time guard of the GPU images: the base's torch is built with the CUDA
# the image declares (its label org.grpo-deploy.cuda-version, which preflight
# compares with the host's NVIDIA driver), and a TRITON_PTXAS_PATH the image
# sets points at a ptxas that exists.
set -eu

want=${1:?usage: check-cuda.sh MAJOR.MINOR}
# torch/version.py read on its own, without loading libtorch: the answer is the same, it takes no time, and it works
# where torch cannot load (an arm64 build under QEMU user emulation: oneDNN reads a CPU id sysfs file qemu lacks).
found=$(python3 -c '
import importlib.util, sys
spec = importlib.util.find_spec("torch")
path = spec.submodule_search_locations[0] + "/version.py" if spec else sys.exit("no torch")
version = importlib.util.spec_from_file_location("torch_version", path)
module = importlib.util.module_from_spec(version)
version.loader.exec_module(module)
print(module.cuda or "none")' 2>/dev/null | tail -n 1)
if [ "$found" != "$want" ]; then
    echo "check-cuda.sh: the base's torch is built with CUDA ${found:-?}, the image declares $want (ARG CUDA)" >&2
    exit 1
fi
if [ -n "${TRITON_PTXAS_PATH:-}" ] && [ ! -x "$TRITON_PTXAS_PATH" ]; then
    echo "check-cuda.sh: TRITON_PTXAS_PATH=$TRITON_PTXAS_PATH is not an executable in this base" >&2
    exit 1
fi
echo "ok: torch built with CUDA $found${TRITON_PTXAS_PATH:+, ptxas $TRITON_PTXAS_PATH}"
