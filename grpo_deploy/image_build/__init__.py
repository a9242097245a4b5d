"""The kit's image builds without a registry (classic Docker builder, Docker SDK): locks, wheelhouses, the recipe
table, the cached dependency image plus the thin code image, in-image checks, the debootstrap base; `grpo-deploy
images`."""
