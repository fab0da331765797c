"""The simplest correct thread-bound schedule family, for testing the GPU backends' whole-model path apart from
compiler/schedules/gpu.py: every output's axes fused and split over blocks of 64 threads, one element per thread;
every other stage inlined, or, if it reduces, computed per element in local memory. Slow, but every anchor kind
lowers with it."""

from __future__ import annotations

import compiler.te as te
from compiler.schedules.cpu import _add_unread_inputs
from compiler.te.tensor import ComputeOp, Reduce

SPACE_VERSION = 0
THREADS = 64


def schedule_group(group, target, config=None):
    if config is not None and hasattr(config, "template"):
        config.template = "gpu_test_one_element_per_thread"
    outputs = [tensor for tensor in group.outputs if isinstance(tensor.op, ComputeOp)]
    schedule = te.create_schedule(list(dict.fromkeys(tensor.op for tensor in outputs)))
    _add_unread_inputs(schedule, group.inputs)
    output_stages = [stage for stage in schedule.stages if stage.is_output]
    threads = {}
    for stage in output_stages:
        fused = stage.fuse(*stage.op.axis) if len(stage.op.axis) > 1 else stage.op.axis[0]
        block, thread = stage.split(fused, THREADS)
        stage.bind(block, te.thread_axis("blockIdx.x"))
        stage.bind(thread, te.thread_axis("threadIdx.x"))
        threads[stage] = thread
    for stage in schedule.stages:
        if stage.is_output or not isinstance(stage.op, ComputeOp):
            continue
        if isinstance(stage.op.body, Reduce):
            reader = next(s for s in output_stages if stage in schedule.producers_of(s, transitive=True))
            stage.set_scope("local")
            stage.compute_at(reader, threads[reader])
        else:
            stage.compute_inline()
    return schedule
