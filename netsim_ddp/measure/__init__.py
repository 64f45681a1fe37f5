"""What the ranks' results become: the results document's shape, one mode's measurements, the all-
reduce probe's trust."""
