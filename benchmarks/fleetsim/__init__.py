"""A discrete-event model of an okq fleet (benchmarks/fleet_sim.py runs it)."""
