import os
import sys

# The package from this checkout, whatever is installed.
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
