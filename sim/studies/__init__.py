"""sim.studies: what is built on the simulator core (sim/): many replays and what they answer.

sweep.py (grids of replays, resumable, on Ray or in-process), plan.py (each system's peak throughput under a TPOT
SLO, on sweep's points), sensitivity.py (the metrics' weight on each uncertain cost constant), policy_compare.py with
peers.py (one group's reference stream through our policies and libCacheSim's). The core never imports these.
"""
