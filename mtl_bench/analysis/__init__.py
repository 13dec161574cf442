"""Reading finished runs back (their records and logged scalars) and the statistics that the engine, the report and
the study share: Δm, t intervals, paired tests, ranks, the selection criterion, front metrics."""
