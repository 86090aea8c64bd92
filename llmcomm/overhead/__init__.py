"""What communication costs: effective bandwidth, GPU utilization and the iteration-time formulation."""

from .bandwidth import Bandwidth as Bandwidth
from .bandwidth import fit_sweeps as fit_sweeps
from .bandwidth import load_calibration as load_calibration
