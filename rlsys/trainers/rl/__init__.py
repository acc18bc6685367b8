"""The RL program: the controller, its recovery and rollout-pool scaling, the run state they
share, and the collector."""
