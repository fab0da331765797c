"""`python -m tests.fuzz [--cases N] [--seed S] [--zoo mlp,digits,...] [--compile-every K]`: the model fuzzer's
long mode (tests/fuzz/test_fuzz_models.py runs a short one). Prints each case before it runs it, then a summary,
and exits 1 if any case ended in a defect."""

import argparse
import json
import sys

from tests.fuzz.fuzz_models import run_cases

parser = argparse.ArgumentParser(prog="python -m tests.fuzz")
parser.add_argument("--cases", type=int, default=2000)
parser.add_argument("--seed", type=int, default=1)
parser.add_argument("--zoo", default="mlp,digits,dwconv_block,mobilenet_v2,resnet18", help="zoo models to mutate")
parser.add_argument("--compile-every", type=int, default=10, help="compile one case in K (the rest run the reference)")
args = parser.parse_args()
report = run_cases(args.cases, args.seed, tuple(filter(None, args.zoo.split(","))), args.compile_every)
print(json.dumps({"outcomes": dict(report.outcomes.most_common()), "defects": report.defects}, indent=1))
sys.exit(1 if report.defects else 0)
