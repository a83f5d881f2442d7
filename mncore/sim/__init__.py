"""The MN-Core 2 hardware description and the cost model the simulator uses for device time."""
from mncore.sim.cost import CostModel, KernelCost, cost_model
from mncore.sim.hardware import Hardware, hardware

__all__ = ["CostModel", "KernelCost", "Hardware", "cost_model", "hardware"]
