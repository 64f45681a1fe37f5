# Root conftest: the benchmarks are run on purpose (`pytest bench/`), not with the tests.
collect_ignore = ["build", "dist"]
