"""`python -m tests.fuzz [--cases N] [--seed S] [--zoo mlp,digits,...] [--compile-every K] [--quantized]`: the model
fuzzer's long mode (tests/fuzz/test_fuzz_models.py runs a short one). `--quantized` mutates the quantized seeds of
fuzz_quantized.py with their integer mutations instead of the small and zoo models. Prints each case before it runs
it, then a summary, and exits 1 if any case ended in a defect."""

import argparse
import json
import sys

from tests.fuzz import fuzz_quantized
from tests.fuzz.fuzz_models import base_models, run_cases

parser = argparse.ArgumentParser(prog="python -m tests.fuzz")
parser.add_argument("--cases", type=int, default=2000)
parser.add_argument("--seed", type=int, default=1)
parser.add_argument("--zoo", default="mlp,digits,dwconv_block,mobilenet_v2,resnet18", help="zoo models to mutate")
parser.add_argument("--compile-every", type=int, default=10, help="compile one case in K (the rest run the reference)")
parser.add_argument("--quantized", action="store_true", help="mutate the quantized seeds instead")
args = parser.parse_args()
if args.quantized:
    models = {name: model.SerializeToString() for name, model in fuzz_quantized.quantized_models().items()}
    report = run_cases(args.cases, args.seed, models, args.compile_every, fuzz_quantized.MUTATIONS)
else:
    report = run_cases(args.cases, args.seed, base_models(tuple(filter(None, args.zoo.split(",")))), args.compile_every)
print(json.dumps({"outcomes": dict(report.outcomes.most_common()), "defects": report.defects}, indent=1))
sys.exit(1 if report.defects else 0)
