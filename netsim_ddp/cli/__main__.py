"""python -m netsim_ddp.cli"""

from netsim_ddp.cli import main

main()
