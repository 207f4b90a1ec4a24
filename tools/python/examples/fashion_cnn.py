#!/usr/bin/python3
"""fashion_cnn.py: dsnode's native CNN (train.model = cnn: conv3x3:32,
maxpool2, conv3x3:64, maxpool2, linear:128, linear:10) in PyTorch on
Fashion-MNIST under dsnode gossip: fashion_mlp.py with --model cnn.

    dslaunch local -n 4 --config conf/examples/cluster.ini \\
        -- python3 tools/python/examples/fashion_cnn.py --steps 1500
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fashion_mlp import main  # noqa: E402

if __name__ == "__main__":
    main("cnn")
