"""Unit tests for grpo_deploy.runtime."""
