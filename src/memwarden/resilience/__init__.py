"""Fault injection and A/B campaigns: injectors, workers in subprocesses under real limits,
executors (local pool or Ray), statistics and campaign reports.
"""
