"""The okq compactor process: folds tombstones, merges segments, enforces
retention and collects garbage. Run ``okq-compactor`` or ``python -m compactor``."""

from compactor.core import Compactor, CompactorOptions, Report

__all__ = ["Compactor", "CompactorOptions", "Report"]
