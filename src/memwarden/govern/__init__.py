"""Device governance without torch: telemetry sources and recorded logs, the budget policy
(``BudgetController``) and scaled replays of logs.
"""
