"""`mambaradix replay`: what a hybrid prefix cache saves on a workload, per policy."""
