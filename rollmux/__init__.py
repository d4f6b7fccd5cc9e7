"""RollMux: many RL post-training jobs sharing one disaggregated GPU cluster."""

__version__ = "0.1.0"
