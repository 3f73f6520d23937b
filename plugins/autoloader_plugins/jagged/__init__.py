"""Jagged event tables, the form most experiments keep events in: per-item columns plus
per-event extents, in HDF5 (km3pipe/PyTables, offsets or counts), ROOT (through uproot)
and Parquet (through pyarrow). One reader per layout (``h5``, ``root``, ``parquet``), one
dataset over any number of files (``events``)."""
