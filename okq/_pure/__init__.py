"""The per-item hot path in pure Python: the reference, and the source that setup.py
compiles into okq/_compiled/. Callers reach it through okq/leases.py and okq/tokens.py."""
