"""What communication costs: effective bandwidth, GPU utilization and the iteration-time formulation
(findings F5, F6). Exports one per line; ``memory_per_gpu`` is :func:`.memory.memory` (the name ``memory``
is the module)."""

from .bandwidth import Bandwidth as Bandwidth
from .bandwidth import BandwidthModel as BandwidthModel
from .bandwidth import against_measured as against_measured
from .bandwidth import effective_bandwidth as effective_bandwidth
from .bandwidth import fit_sweeps as fit_sweeps
from .bandwidth import held_out as held_out
from .bandwidth import inter_node_basis as inter_node_basis
from .bandwidth import load_calibration as load_calibration
from .bandwidth_report import bus_bandwidth as bus_bandwidth
from .bandwidth_report import equals_calibration as equals_calibration
from .bandwidth_report import fit_busbw as fit_busbw
from .bandwidth_report import held_out_rows as held_out_rows
from .bandwidth_report import held_out_summary as held_out_summary
from .bandwidth_report import large_message_busbw as large_message_busbw
from .bandwidth_report import leave_one_out as leave_one_out
from .bandwidth_report import model_on_fitted_rows as model_on_fitted_rows
from .bandwidth_report import one_line_vs_pieces as one_line_vs_pieces
from .bandwidth_report import piece_table as piece_table
from .bandwidth_report import residual_table as residual_table
from .gemm import GemmModel as GemmModel
from .gemm import load_gemm_model as load_gemm_model
from .iteration import Breakdown as Breakdown
from .iteration import iteration_time as iteration_time
from .iteration import iteration_times as iteration_times
from .memory import MemoryBreakdown as MemoryBreakdown
from .memory import memory as memory_per_gpu  # the function; `memory` stays the module
from .memory import memory_table as memory_table
from .memory import model_state as model_state
from .utilization import Utilization as Utilization
from .validation import validate as validate

__all__ = [
    "against_measured",
    "Bandwidth",
    "BandwidthModel",
    "Breakdown",
    "bus_bandwidth",
    "effective_bandwidth",
    "equals_calibration",
    "fit_busbw",
    "fit_sweeps",
    "held_out",
    "held_out_rows",
    "held_out_summary",
    "iteration_time",
    "iteration_times",
    "large_message_busbw",
    "leave_one_out",
    "load_calibration",
    "memory_per_gpu",
    "memory_table",
    "MemoryBreakdown",
    "model_on_fitted_rows",
    "model_state",
    "one_line_vs_pieces",
    "piece_table",
    "residual_table",
    "Utilization",
    "validate",
]
