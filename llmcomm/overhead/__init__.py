"""What communication costs: effective bandwidth, GPU utilization and the iteration-time formulation
(findings F5, F6). Exports one per line."""

from .bandwidth import Bandwidth as Bandwidth
from .bandwidth import against_measured as against_measured
from .bandwidth import effective_bandwidth as effective_bandwidth
from .bandwidth import fit_sweeps as fit_sweeps
from .bandwidth import held_out as held_out
from .bandwidth import load_calibration as load_calibration
from .iteration import Breakdown as Breakdown
from .iteration import iteration_time as iteration_time
from .iteration import iteration_times as iteration_times
from .memory import MemoryBreakdown as MemoryBreakdown
from .memory import memory as memory
from .memory import memory_table as memory_table
from .utilization import Utilization as Utilization
