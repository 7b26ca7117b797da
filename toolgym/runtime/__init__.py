"""What a training process needs around the algorithm, not in it: the time budget of a run
(`budget`), the wall time and peak memory of its stages (`stages`), handing freed heap memory
back to the system (`heap`), and a rank that ends itself when its launcher is gone
(`launcher_watch`). Nothing here knows about policies, losses or trajectories.
"""
