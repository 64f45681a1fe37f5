"""The launching side: torchrun on every node, a user's script per variant, the rank spec's
and results' files, the measured window's signals. Never imports torch
(tests/unit/test_layers.py): the ranks it starts do, in workload/ranks/."""
