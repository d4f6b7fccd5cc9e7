"""Pure scheduling core: specs, cost model, round-robin groups and placement.

No I/O and no clock: the simulator and the runtime drive the same code.
"""
