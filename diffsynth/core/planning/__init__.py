"""Memory planning: predict a training step's device memory, host memory and time before any weight is loaded.

``footprint.py`` (saved activations and FLOPs of a dry run on the meta device), ``residency.py`` (what each offload
policy holds and moves), ``profiles.py`` (device figures), ``plans.py`` (candidate placements, predictions, choice).
The trainer's flags are turned into a workload by ``diffsynth.training.placement.planner``.
"""
