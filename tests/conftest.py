import os
import sys

# Tests import the NumPy transcription of the paper as a plain module.
sys.path.insert(0, os.path.dirname(__file__))
