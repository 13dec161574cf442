"""`mtl-bench study`: a fair comparison of balancing methods as a plan of ordinary runs.

spec (the study's config) -> space (the trials each method gets) -> plan (every run, by id) -> launch (Hydra's
launcher runs them) -> select (on validation only) -> results (study.json, paired statistics) -> report.
"""
