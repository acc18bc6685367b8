"""The RL program: the controller, its recovery and rollout-pool scaling, and the run state
they share."""
