"""Grouping algorithms: one module per algorithm, pure functions over numpy arrays
plus thin scikit-learn-style classes (``fit()`` returning self, ``labels_``)."""
