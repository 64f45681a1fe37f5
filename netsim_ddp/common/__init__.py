"""Ground: what every wing shares (files written whole, the job's clock, signal files, session
options, sample statistics, the version)."""
