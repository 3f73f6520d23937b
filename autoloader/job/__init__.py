"""The job a process belongs to, for the tuner, the loader, the guard and the metrics:
its rank and process group, the ranks' agreement on what must match, and whether the
other ranks are still alive. Below them all: it imports none of them."""
