"""stepgap: step-level evidence-gap detection for search agents, and a typed process reward.

Subpackages: `stepgap.data_builders` (contracts, segmentation, datasets), `stepgap.teacher`
(the hybrid checker), `stepgap.eval` (metrics and reports). Import them directly; this module
stays light so `stepgap --help` is instant.
"""

__version__ = "0.1.0"
