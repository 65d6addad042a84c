"""covey device agent: the part that runs on a board.

Dependencies are kept small (numpy, paho-mqtt, a LiteRT interpreter, zeroconf);
nothing here imports TensorFlow or anything from ``server/`` or ``models/``.
"""
