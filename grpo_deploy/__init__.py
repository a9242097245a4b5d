"""grpo-deploy: render, check and launch GRPO + LoRA post-training deployments."""

__version__ = "0.1.0"
