"""Measurements judged: expectations, wire and crossing checks, baselines, history and its change
points, a scenario's outcome."""
