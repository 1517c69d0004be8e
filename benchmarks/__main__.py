"""python -m benchmarks NAME [ARGS] in a source checkout (`river bench` when installed):
`--help` lists the benchmarks, `NAME --help` explains one."""

import sys

from . import listing, run

PROG = f"python -m {__package__}"
if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
    print(listing(PROG))
    sys.exit(0 if len(sys.argv) >= 2 else 2)
run(sys.argv[1], sys.argv[2:], PROG)
