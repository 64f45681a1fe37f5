"""What starts ranks: torchrun on every node (launch), a user's script per variant
(script_launch). Never imports torch (tests/unit/test_layers.py): the ranks it starts do, in
workload/ranks/; what both sides share is in workload/contract/."""
