"""How batches are made and moved, for the tuner's trials and the loader alike: collation,
the pipelined copy to the device, worker processes that start safely, and the CPUs they
run on. Below both: it imports neither ``autoloader.tuning`` nor ``autoloader.loader``."""
