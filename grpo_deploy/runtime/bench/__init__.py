"""`grpo-deploy bench trainer` inside the trainer image: the packed forward/backward step timed on synthetic
rollouts of a profile's shape, the speed switches compared, FLOPs and the report."""
