# GPU images for users who have Docker Buildx (BuildKit): one image per
# architecture with a per-arch tag, plus (after pushing both) one manifest tag.
# The cpu image is built by `grpo-deploy images build cpu` (classic builder, no registry).
#
# Tags: REGISTRY/<image>:<TAG>-<CUDA>-<arch>, e.g. grpo-deploy/vllm:0.1.0-cu130-arm64,
# and the manifest REGISTRY/<image>:<TAG>-<CUDA>. The same formula is
# grpo_deploy/image_build/tags.py, and the profiles name these per-arch tags;
# tests/static/test_images.py fails when they disagree.
#
# Run from the repository root (bake resolves contexts against the current
# directory), after making the wheelhouses the trainer and verl images install
# from (on a connected machine, one per architecture):
#   grpo-deploy images wheelhouse trainer-amd64
#   docker buildx bake -f images/docker-bake.hcl --load            # vllm + trainer, this machine's arch
#   docker buildx bake -f images/docker-bake.hcl --load verl
# Both architectures only when asked (the docker driver cannot --load a
# multi-platform result: push it, or use a docker-container builder):
#   ARCHES=amd64,arm64 docker buildx bake -f images/docker-bake.hcl --push gpu
#   docker buildx imagetools create -t REGISTRY/vllm:0.1.0-cu130 \
#       REGISTRY/vllm:0.1.0-cu130-amd64 REGISTRY/vllm:0.1.0-cu130-arm64     # the manifest tag, per image
# Cross-building arm64 on x86 needs QEMU and is slow: these images only add
# layers to prebuilt vLLM images, so it is feasible, but building on the
# Spark itself is quicker.
#
# Version pins are NOT repeated here: each lives in its Dockerfile's ARG
# defaults (vLLM in images/vllm/Dockerfile, TRL/PEFT/kernels in
# images/trainer/Dockerfile, verl in images/verl/Dockerfile) and in the lock
# files derived from them.

variable "REGISTRY" {
  # Image name prefix, e.g. a registry path such as <registry>/team/grpo-deploy
  default = "grpo-deploy"
}

variable "TAG" {
  # The kit version (grpo_deploy.__version__); the Makefile passes it.
  default = "0.1.0"
}

variable "CUDA" {
  # The CUDA of the images' torch as a tag suffix (their ARG CUDA=13.0).
  default = "cu130"
}

variable "ARCHES" {
  # Empty: this machine's architecture only (what the docker driver can
  # --load). "amd64,arm64": both (amd64: a100, h200; arm64: gb10).
  default = ""
}

variable "UID" {
  # Run user of every image; trainer and server must agree.
  default = "1000"
}

variable "GID" {
  default = "1000"
}

function "tag" {
  params = [image, arch]
  result = "${REGISTRY}/${image}:${TAG}-${CUDA}-${arch}"
}

function "manifest_tag" {
  params = [image]
  result = "${REGISTRY}/${image}:${TAG}-${CUDA}"
}

function "arches" {
  # BAKE_LOCAL_PLATFORM is e.g. linux/amd64 or linux/arm64/v8.
  params = [wanted]
  result = wanted != "" ? split(",", wanted) : [element(split("/", BAKE_LOCAL_PLATFORM), 1)]
}

group "default" {
  targets = ["vllm", "trainer"]
}

group "gpu" {
  targets = ["vllm", "trainer", "verl"]
}

target "_common" {
  context = "."
  args = {
    UID         = UID
    GID         = GID
    KIT_VERSION = TAG
  }
}

target "vllm" {
  name       = "vllm-${arch}"
  matrix     = { arch = arches(ARCHES) }
  inherits   = ["_common"]
  dockerfile = "images/vllm/Dockerfile"
  platforms  = ["linux/${arch}"]
  tags       = [tag("vllm", arch)]
}

target "trainer" {
  name       = "trainer-${arch}"
  matrix     = { arch = arches(ARCHES) }
  inherits   = ["_common"]
  dockerfile = "images/trainer/Dockerfile"
  platforms  = ["linux/${arch}"]
  # FROM the vllm target of this same bake run and architecture: the trainer
  # carries exactly the server's vLLM.
  contexts = {
    "grpo-deploy-server" = "target:vllm-${arch}"
  }
  args = {
    BASE_IMAGE = "grpo-deploy-server"
  }
  tags = [tag("trainer", arch)]
}

target "verl" {
  name       = "verl-${arch}"
  matrix     = { arch = arches(ARCHES) }
  inherits   = ["_common"]
  dockerfile = "images/verl/Dockerfile"
  platforms  = ["linux/${arch}"]
  tags       = [tag("verl", arch)]
}
