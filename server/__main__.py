"""`python -m server`: the compile service without going through the `tessel` command; the same
arguments as `tessel serve`."""

import argparse
import sys

from compiler.errors import TesselError
from server.app import add_arguments, run_from_args

parser = argparse.ArgumentParser(prog="python -m server", description="serve the Tessel compile service")
add_arguments(parser)
try:
    sys.exit(run_from_args(parser.parse_args()))
except TesselError as error:
    print(f"tessel serve: error: {error}", file=sys.stderr)
    sys.exit(2)
