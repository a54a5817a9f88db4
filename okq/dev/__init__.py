"""Development tooling, apart from the product: SeaweedFS and nginx as local
processes (servers.py, nginx.py) and a whole fleet on loopback (fleet.py), for
``okq fleet``, the tests and the benchmarks. Nothing of the product imports it
but the ``okq fleet`` command.
"""
