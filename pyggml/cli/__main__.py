import sys

from pyggml.cli import main

sys.exit(main())
