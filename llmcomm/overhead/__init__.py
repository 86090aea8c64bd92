"""What communication costs: effective bandwidth, GPU utilization and the iteration-time formulation."""

from .bandwidth import Bandwidth as Bandwidth
from .bandwidth import against_measured as against_measured
from .bandwidth import effective_bandwidth as effective_bandwidth
from .bandwidth import fit_sweeps as fit_sweeps
from .bandwidth import held_out as held_out
from .bandwidth import load_calibration as load_calibration
