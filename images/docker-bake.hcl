# Multi-arch GPU images for users who have Docker Buildx (BuildKit).
# The cpu image is built by images/build.sh (classic builder, no registry).
#
# Run from the repository root (bake resolves contexts against the current
# directory), after making the wheelhouses the trainer and verl images install
# from (on a connected machine, one per architecture):
#   images/build.sh wheelhouse trainer --arch amd64
#   images/build.sh wheelhouse trainer --arch arm64
#   docker buildx bake -f images/docker-bake.hcl --push            # vllm + trainer
#   docker buildx bake -f images/docker-bake.hcl --push verl
#   PLATFORMS=linux/arm64 docker buildx bake -f images/docker-bake.hcl --load
# A multi-platform result cannot be --load-ed into the classic image store;
# push it to a registry, or build one platform with --load.
# Cross-building arm64 on x86 needs QEMU and is slow: these images only add
# layers to prebuilt vLLM images, so it is feasible, but building on the
# Spark itself is quicker.
#
# Version pins are NOT repeated here: each lives in its Dockerfile's ARG
# defaults (vLLM in images/vllm/Dockerfile, TRL/PEFT/kernels in
# images/trainer/Dockerfile, verl in images/verl/Dockerfile) and in the lock
# files derived from them.

variable "REGISTRY" {
  # Image name prefix, e.g. registry.example.com/team/grpo-deploy
  default = "grpo-deploy"
}

variable "TAG" {
  # The kit version (grpo_deploy.__version__); the Makefile passes it.
  default = "0.1.0"
}

variable "UID" {
  # Run user of every image; trainer and server must agree.
  default = "1000"
}

variable "GID" {
  default = "1000"
}

variable "PLATFORMS" {
  # linux/amd64: a100, h200 profiles. linux/arm64: gb10 (DGX Spark).
  default = "linux/amd64,linux/arm64"
}

group "default" {
  targets = ["vllm", "trainer"]
}

group "gpu" {
  targets = ["vllm", "trainer", "verl"]
}

target "_common" {
  context   = "."
  platforms = split(",", PLATFORMS)
  args = {
    UID         = UID
    GID         = GID
    KIT_VERSION = TAG
  }
}

target "vllm" {
  inherits   = ["_common"]
  dockerfile = "images/vllm/Dockerfile"
  tags       = ["${REGISTRY}/vllm:${TAG}"]
}

target "trainer" {
  inherits   = ["_common"]
  dockerfile = "images/trainer/Dockerfile"
  # FROM the vllm target of this same bake run, per platform: the trainer
  # carries exactly the server's vLLM.
  contexts = {
    "grpo-deploy-server" = "target:vllm"
  }
  args = {
    BASE_IMAGE = "grpo-deploy-server"
  }
  tags = ["${REGISTRY}/trainer:${TAG}"]
}

target "verl" {
  inherits   = ["_common"]
  dockerfile = "images/verl/Dockerfile"
  tags       = ["${REGISTRY}/verl:${TAG}"]
}
