"""`pack`: existing datasets (NVIDIA HDF5, google-research TFRecords of tf.train.Example) -> instances,
kept exactly, then the shared write phase (pack)."""
