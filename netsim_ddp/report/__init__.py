"""What people and CI read: tables, plots, the report's timeline, CI summaries and exports."""
