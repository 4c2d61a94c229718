"""Usage accounting: the per-member daily rollup, its report and its rebuild from the audit log.
"""
